"""`moepack fetch` for torrents and magnets: download, resume, repair, verify, publish."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import libtorrent as lt
from moepack.fetch.container import (
    Checked,
    check_container,
    header_claim,
    peek_container_id,
)
from moepack.fetch.errors import FetchError
from moepack.fetch.lock import dest_lock
from moepack.fetch.lt_session import (
    POLL_S,
    RECONNECT_EVERY_S,
    Trouble,
    connect_peers,
    drain,
    is_loopback,
    make_session,
)
from moepack.fetch.magnet import metadata_from_peers
from moepack.fetch.space import SAFETY_MARGIN, SpaceNeed, SpaceVerdict, verdicts
from moepack.fetch.staging import Staging
from moepack.fetch.torrent_source import CONTAINER_MAGIC as MAGIC
from moepack.fetch.torrent_source import TorrentMeta, describe, load_params

RESUME_EVERY_S = 30.0
MAX_APPENDED = 64 << 20   # bytes after the end of a copy that a repair sets aside
_CHECKING = (lt.torrent_status.checking_files, lt.torrent_status.checking_resume_data,
             lt.torrent_status.queued_for_checking, lt.torrent_status.allocating)
_DONE = (lt.torrent_status.seeding, lt.torrent_status.finished)


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    rate: float          # bytes/s, payload
    peers: int
    state: str


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class TorrentPlan:
    """Dry run: what the torrent holds and whether it fits."""

    meta: TorrentMeta
    final: Path
    present: int          # bytes already allocated by a partial or damaged copy
    verdict: SpaceVerdict


@dataclass(frozen=True)
class TorrentFetchResult:
    path: Path
    container_id: str
    size: int
    downloaded_bytes: int     # payload received in this run
    pieces: int
    pieces_at_start: int      # valid pieces found (resume data or recheck) before downloading
    seconds: float
    already_complete: bool = False


@dataclass(frozen=True)
class FetchOptions:
    peers: Sequence[tuple[str, int]] = ()
    listen: str | None = None
    discovery: bool | None = None
    stall_timeout: float = 600.0       # no byte for this long -> error (rerun resumes)
    metadata_timeout: float = 120.0
    progress: ProgressFn | None = None


def fetch_torrent(source: str, dest: Path, *, dry_run: bool = False,
                  opts: FetchOptions = FetchOptions()) -> TorrentFetchResult | TorrentPlan:
    dest = Path(dest).absolute()
    params = load_params(source)
    ses: lt.session | None = None
    if params.ti is None:
        ses = _session(opts)
        params.ti = metadata_from_peers(ses, params, opts.peers, opts.metadata_timeout)
    meta = describe(params.ti, source)
    stage = Staging(dest, meta.name, meta.info_hash)
    if dry_run:
        return plan(meta, stage)
    return _Download(ses or _session(opts), params, meta, stage, opts).run()


def _session(opts: FetchOptions) -> lt.session:
    return make_session(opts.listen or _default_listen(opts.peers), discovery=opts.discovery)


def plan(meta: TorrentMeta, stage: Staging) -> TorrentPlan:
    reused = reusable(meta, stage)
    present = max(_allocated(stage.file), _allocated(stage.final),
                  _allocated(reused) if reused else 0)
    need = SpaceNeed("download", stage.dest, max(0, meta.size - present))
    return TorrentPlan(meta, stage.final, present, verdicts([need])[0])


def same_container(meta: TorrentMeta, path: Path) -> bool:
    """Whether the header of `path` (its own hash checks) names the torrent's container."""
    return meta.container_id is not None and header_claim(path) == meta.container_id


def reusable(meta: TorrentMeta, stage: Staging) -> Path | None:
    """A copy of this container that another torrent of it (other piece size, v1 or v2 only)
    left in staging: reused, since libtorrent keeps each piece of it that passes. A copy whose
    header is not there yet cannot say what it is and is not taken."""
    for other in stage.others():
        if same_container(meta, other) and _size(other) <= meta.size:
            return other
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:   # gone meanwhile: too big to take
        return 1 << 63


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def _default_listen(peers: Sequence[tuple[str, int]]) -> str:
    # Only loopback peers given: stay on loopback (no discovery, nothing exposed).
    if peers and all(is_loopback(h) for h, _ in peers):
        return "127.0.0.1:0"
    return "0.0.0.0:6881"


class _Download:
    """One fetch: adopt what is at the destination, download, verify, publish."""

    def __init__(self, ses: lt.session, params: lt.add_torrent_params, meta: TorrentMeta,
                 stage: Staging, opts: FetchOptions) -> None:
        self.ses, self.params, self.meta, self.stage, self.opts = ses, params, meta, stage, opts
        self.t0 = time.monotonic()
        self.downloaded = 0
        self.trouble = Trouble()

    def run(self) -> TorrentFetchResult:
        with dest_lock(self.stage.dest):
            return self._run()

    def _run(self) -> TorrentFetchResult:
        done = self._already_there()
        if done is not None:
            return done
        verdict = plan(self.meta, self.stage).verdict
        if not verdict.ok:
            raise FetchError(f"{self.stage.dest}: {verdict.free} bytes free, the download needs "
                             f"{verdict.need_with_margin} (with a {SAFETY_MARGIN:.0%} margin); "
                             "nothing written")
        self.stage.prepare()
        adopted = self.stage.adopt_final(self.meta.size)
        self._reuse_other_staging()
        try:
            at_start = self._transfer(recheck=False)
            checked = check_container(self.stage.file)
            if not checked.ok and self._is_container(checked):
                # Resume data can vouch for pieces that changed on disk since: rehash, refetch.
                self._transfer(recheck=True)
                checked = check_container(self.stage.file)
            self._require_valid(checked)
        except BaseException:
            if adopted is not None:
                self.stage.give_back(adopted)
            raise
        path = self.stage.publish()
        self._drop_superseded()
        return TorrentFetchResult(path, checked.container_id or "", self.meta.size, self.downloaded,
                                  self.meta.num_pieces, at_start, time.monotonic() - self.t0)

    def _reuse_other_staging(self) -> None:
        other = reusable(self.meta, self.stage)
        if other is not None and not os.path.lexists(self.stage.file):
            try:
                self.stage.reuse(other)
            except OSError as e:
                raise FetchError(f"cannot move {other} to {self.stage.file}: "
                                 f"{e.strerror or e}") from e

    def _drop_superseded(self) -> None:
        """Other torrents' staging of this container, or of this file name (whose final name
        now holds a verified container, so it could never be published): removed."""
        for other in self.stage.others():
            if other.name == self.meta.name or same_container(self.meta, other):
                self.stage.remove_other(other)

    def _already_there(self) -> TorrentFetchResult | None:
        final, expected = self.stage.final, self.meta.container_id
        if not os.path.lexists(final):
            return None
        if final.is_symlink():   # repair would move the link into staging and write through it
            raise FetchError(f"{final} is a symbolic link; not touching it (move it away first)")
        if not final.is_file():
            raise FetchError(f"{final} exists and is not a regular file")
        claimed = peek_container_id(final) or header_claim(final)
        if expected is None:
            raise FetchError(f"{final} exists and the torrent names no container ID to compare "
                             "it with; move it away first")
        if claimed is not None and claimed != expected:
            raise FetchError(f"{final} exists and is another container ({claimed}); the torrent "
                             f"holds {expected}. Not touching it.")
        if claimed is None and not self._damaged_copy(final):
            raise FetchError(f"{final} exists and is not a copy of this container (unreadable "
                             "header, other size); move it away first")
        extra = final.stat().st_size - self.meta.size
        if extra > MAX_APPENDED:   # set aside during the repair: that copy must stay small
            raise FetchError(f"{final} names this container but is {extra} bytes longer than "
                             f"the torrent's {self.meta.size}; truncate it to {self.meta.size} "
                             "bytes or move it away first")
        checked = check_container(final)
        if checked.ok and checked.container_id == expected:
            return TorrentFetchResult(final, expected, self.meta.size, 0, self.meta.num_pieces,
                                      self.meta.num_pieces, time.monotonic() - self.t0, True)
        return None   # damaged copy of this container: repair it

    def _damaged_copy(self, path: Path) -> bool:
        """Unreadable ID, but the torrent's size and moepack's magic: worth repairing."""
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
        return path.stat().st_size == self.meta.size and head == MAGIC

    def _is_container(self, checked: Checked) -> bool:
        return checked.container_id is not None

    def _require_valid(self, checked: Checked) -> None:
        where = f"{self.meta.source} (kept at {self.stage.file})"
        if checked.container_id is None:
            raise FetchError(f"content of torrent {where} is not a container this moepack reads: "
                             f"{checked.problem}")
        if not checked.ok:
            raise FetchError(f"content of torrent {where} does not verify: {checked.problem}")
        if self.meta.container_id and checked.container_id != self.meta.container_id:
            raise FetchError(f"content of torrent {where} has container ID {checked.container_id}, "
                             f"the torrent promises {self.meta.container_id}")

    def _add(self, recheck: bool) -> lt.torrent_handle:
        params = self.params
        resume = None if recheck else self.stage.read_resume()
        if resume is not None:
            try:
                loaded = lt.read_resume_data(resume)
                if str(loaded.info_hashes.get_best()) == self.meta.info_hash:
                    loaded.ti = self.meta.ti
                    params = loaded
            except RuntimeError:
                pass   # unreadable resume data: libtorrent rechecks the file instead
        if recheck:
            self.stage.drop_resume()
        params.save_path = str(self.stage.dir)
        params.flags &= ~(lt.torrent_flags.auto_managed | lt.torrent_flags.paused
                          | lt.torrent_flags.seed_mode | lt.torrent_flags.upload_mode)
        h = self.ses.add_torrent(params)
        # The header first (a deadline: the picker's priorities lose to allowed-fast pieces): a
        # copy left by an interrupted fetch then says which container it is, so that another
        # torrent of the same container can reuse it.
        h.set_piece_deadline(0, 0)
        return h

    def _transfer(self, recheck: bool) -> int:
        """Run libtorrent until every piece is there; returns pieces valid before downloading."""
        h = self._add(recheck)
        try:
            at_start = self._until_done(h)
        finally:
            self._close(h)
        return at_start

    def _until_done(self, h: lt.torrent_handle) -> int:
        at_start: int | None = None
        last_done, last_connect = -1, 0.0
        last_change = last_save = time.monotonic()
        while True:
            a = drain(self.ses)
            if a.errors:
                raise FetchError(f"torrent {self.meta.source}: {a.errors[0]}")
            self.trouble.add(a)
            self._keep_resume(a.resume_data)
            st = h.status()
            now = time.monotonic()
            if st.state not in _CHECKING and at_start is None:
                at_start = st.num_pieces
            if st.is_seeding or st.state in _DONE:
                self._report(st)   # the caller sees done == total before verify starts
                self.downloaded += st.total_payload_download
                return at_start if at_start is not None else st.num_pieces
            if st.total_done != last_done or st.state in _CHECKING:
                last_done, last_change = st.total_done, now
            elif now - last_change > self.opts.stall_timeout:
                why = f"; {self.trouble}" if str(self.trouble) else ""
                raise FetchError(f"torrent {self.meta.source}: no data for "
                                 f"{self.opts.stall_timeout:.0f} s (peers: {st.num_peers})"
                                 f"{why}; run again to resume")
            if st.num_peers == 0 and now - last_connect > RECONNECT_EVERY_S:
                connect_peers(h, list(self.opts.peers))
                last_connect = now
            if now - last_save > RESUME_EVERY_S:
                h.save_resume_data(lt.save_resume_flags_t.flush_disk_cache)
                last_save = now
            self._report(st)
            time.sleep(POLL_S)

    def _report(self, st: lt.torrent_status) -> None:
        if self.opts.progress is not None:
            self.opts.progress(Progress(st.total_wanted_done, self.meta.size,
                                        float(st.download_payload_rate), st.num_peers,
                                        str(st.state)))

    def _keep_resume(self, blobs: list[bytes]) -> None:
        for b in blobs:
            self.stage.write_resume(b)

    def _close(self, h: lt.torrent_handle) -> None:
        """Save resume data, then remove the torrent so its file is closed before verify. The
        transfer is over: complete (verified next, the resume data then dropped) or failing
        with its own error, the one the user sees. So a resume file that cannot be saved (a
        disk that filled after the last piece) is skipped, never an error of its own: a rerun
        rechecks the staged file instead."""
        if not h.is_valid():
            return
        try:
            self._save_resume(h)
        except FetchError:
            pass
        self.ses.remove_torrent(h)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not drain(self.ses).removed:
            time.sleep(0.05)

    def _save_resume(self, h: lt.torrent_handle) -> None:
        h.save_resume_data(lt.save_resume_flags_t.flush_disk_cache)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            a = drain(self.ses)
            self._keep_resume(a.resume_data)
            if a.resume_data or a.resume_failed:
                return
            time.sleep(0.05)
