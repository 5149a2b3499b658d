"""moepack's hub downloader vs huggingface_hub's own `hf_hub_download`, on the loopback fake hub
(tests/hub_server.py): does each notice wrong bytes, survive a dropped connection, and how long
does each take for one LFS file (with the SHA-256 check moepack needs)?

    python -m bench.hub_download_compare [--mb 256]

Prints one Markdown block (docs/FETCH.md, "Why not hf_hub_download"). Loopback only: no hub,
no Xet storage (its accelerated transfers cannot be measured here)."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from moepack.fetch.hub_download import DownloadPolicy, download, resolve_url, sha256_of
from moepack.fetch.hub_listing import RemoteFile

from bench.machine import git_commit, machine_line, utc_now

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hub_server import HubRepo, HubServer  # noqa: E402
from range_server import Fault  # noqa: E402

REPO, NAME = "org/model", "model.safetensors"


class CdnElsewhereHub(HubServer):
    """The real hub redirects LFS files to a CDN on another host, and huggingface_hub reads the
    file's metadata from that redirect only then: name the CDN `localhost` instead of 127.0.0.1."""

    def route(self, method, path, query, handler):  # noqa: ANN001, ANN201 - HubServer's
        body = super().route(method, path, query, handler)
        if "Location" in body.headers:
            body.headers["Location"] = body.headers["Location"].replace("127.0.0.1", "localhost")
        return body

FAST = DownloadPolicy(read_timeout=5.0, attempts=2, backoff=0.05)


def _hf(dest: Path) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(REPO, NAME, revision="main", local_dir=dest))


def _moepack(f: RemoteFile, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    download(f, resolve_url(REPO, "main", NAME), dest, FAST)
    return dest / NAME


def _outcome(run: Callable[[], Path], want: str) -> str:
    """What a downloader did: the file it left and whether its bytes are the hub's."""
    try:
        path = run()
    except Exception as e:  # noqa: BLE001 - the error is the result being measured
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
    ok = sha256_of(path).hexdigest() == want
    return "correct file" if ok else "**returned a file with wrong bytes, no error**"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="size of the LFS file")
    a = ap.parse_args()
    data = os.urandom(a.mb << 20)
    sha = hashlib.sha256(data).hexdigest()
    f = RemoteFile(NAME, len(data), sha, "")
    rows = []
    with CdnElsewhereHub({REPO: HubRepo({NAME: data, "config.json": b"{}"})}) as hub, \
            tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_ENDPOINT"] = hub.base
        os.environ.pop("HF_TOKEN", None)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        root = Path(tmp)

        def case(label: str, prepare: Callable[[], None]) -> None:
            got = []
            for who, run in (("hf_hub_download", _hf), ("moepack", lambda d: _moepack(f, d))):
                prepare()
                d = root / f"{label}-{who}".replace(" ", "_")
                got.append(_outcome(lambda r=run, d=d: r(d), sha))
            rows.append(f"| {label} | {got[0]} | {got[1]} |")

        def tampered() -> None:  # same size, one byte flipped: the CDN lies about content
            hub.cdn[sha] = data[:-1] + bytes([data[-1] ^ 0xFF])

        def dropped() -> None:
            hub.cdn[sha] = data
            hub.inject(REPO, NAME, Fault("drop", times=1, at=len(data) // 2))

        case("CDN serves one wrong byte (same size)", tampered)
        case("connection dropped halfway, once", dropped)
        hub.cdn[sha] = data
        hub.faults.clear()
        times = {}
        for who, run in (("hf_hub_download", _hf), ("moepack", lambda d: _moepack(f, d))):
            d = root / f"time-{who}"
            t0 = time.perf_counter()
            path = run(d)
            t1 = time.perf_counter()
            sha256_of(path)  # what hf_hub_download's result still needs before moepack trusts it
            times[who] = (t1 - t0, time.perf_counter() - t1)
    load = os.getloadavg()[0]
    print(f"Measured {utc_now()}, commit {git_commit()}, {machine_line()}, load {load:.1f}, "
          f"huggingface_hub {__import__('huggingface_hub').__version__}, one {a.mb} MiB LFS "
          "file over loopback:\n")
    print("| case | hf_hub_download | moepack |\n|---|---|---|")
    print("\n".join(rows))
    hf, mp = times["hf_hub_download"], times["moepack"]
    print(f"| time: download | {hf[0]:.2f} s | {mp[0]:.2f} s (SHA-256 while streaming) |")
    print(f"| time: + SHA-256 pass after | {hf[0] + hf[1]:.2f} s | not needed |")


if __name__ == "__main__":
    main()
