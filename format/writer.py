"""ContainerWriter (spec/FORMAT.md section 1.1): preallocate, pwrite at planned offsets from one or
several processes, then finalize (hash tables, index, header last, fsync, atomic rename)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import blake3
from moepack.format.errors import FormatError
from moepack.format.header import Header
from moepack.format.layout import BankLayout, Extent, Layout
from moepack.format.limits import HASH_SIZE, MAJOR, MINOR
from moepack.format.mtp import MTP_TYPES

from moepack.durable import fsync_path, naming, reserve
from moepack.safefs import open_existing, open_new

_PARALLEL_HASH_MIN = 1 << 20  # blake3 threads only pay on large inputs
_CHUNK = 16 << 20


def _digest(data: bytes | memoryview) -> bytes:
    threads = blake3.blake3.AUTO if len(data) >= _PARALLEL_HASH_MIN else 1
    return blake3.blake3(data, max_threads=threads).digest()


def partial_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(p.name + ".partial")


class ContainerWriter:
    """Writes `NAME.moepack.partial` at planned offsets; finalize() turns it into `NAME.moepack`.

    Several processes may each open a writer with create=False on the same partial file and write
    disjoint regions; one of them calls finalize() with every digest (missing ones are re-read).
    """

    def __init__(self, path: str | os.PathLike, layout: Layout, *, create: bool = True,
                 overwrite: bool = False) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.layout = layout
        self.overwrite = overwrite
        self._digests: dict[str | tuple[int, int], bytes] = {}
        self._refuse_existing()
        # Never through a link planted at the partial's name: a new partial replaces whatever
        # entry is there (a link itself, never its target) with a fresh inode; attaching opens
        # only an existing regular file (resume, and the worker processes of one conversion).
        self._fd = (open_new(self.partial, os.O_RDWR, replace=True) if create
                    else open_existing(self.partial, os.O_RDWR))
        try:
            if create:
                with naming(self.partial):  # a full disk, RLIMIT_FSIZE: say which file
                    self._preallocate()
            else:
                size = os.fstat(self._fd).st_size
                if size != layout.file_size:
                    raise FormatError(
                        f"{self.partial}: size {size} != planned file size {layout.file_size} "
                        "(made from a different plan?)", "invalid"
                    )
        except BaseException:
            self.close()  # e.g. the disk is too small for the planned size
            raise

    def _refuse_existing(self) -> None:
        """The final name taken (by anything, a dangling link included) needs overwrite=True."""
        if os.path.lexists(self.path) and not self.overwrite:
            raise FileExistsError(f"{self.path} exists; pass overwrite=True to replace it")

    def _preallocate(self) -> None:
        reserve(self._fd, self.layout.file_size)  # zero-filled; a full disk fails now

    def _pwrite(self, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data).cast("B")
        with naming(self.partial):
            while len(view):
                n = os.pwrite(self._fd, view[:_CHUNK], offset)
                view, offset = view[n:], offset + n

    def _write_extent(self, ext: Extent, data: bytes | memoryview) -> bytes:
        if len(data) != ext.length:
            raise ValueError(f"{ext.type} {ext.name!r}: {len(data)} bytes, planned {ext.length}")
        self._pwrite(data, ext.offset)
        digest = _digest(data)
        self._digests[ext.name] = digest
        return digest

    def write_tensor(self, name: str, data: bytes | memoryview) -> bytes:
        """Write a tensor's encoded bytes; returns their BLAKE3 digest."""
        return self._write_extent(self.layout.tensor(name), data)

    def write_blob(self, name: str, data: bytes | memoryview) -> bytes:
        """Write a blob's stored (possibly compressed) bytes; returns their BLAKE3 digest."""
        return self._write_extent(self.layout.blob(name), data)

    def write_expert(self, layer: int, expert: int, record: bytes | memoryview) -> bytes:
        """Write one record: at most record_length bytes (the rest of the stride is zeroed), or
        exactly stride bytes whose tail past record_length is zero. pack_record() builds one.

        Returns the BLAKE3 digest of the whole stride, as stored in the hash table.
        """
        bank = self.layout.bank(layer)
        offset = bank.record_offset(expert)
        record = memoryview(record).cast("B")
        if len(record) == bank.stride:
            if any(record[bank.record_length :]):
                raise ValueError(f"layer {layer} expert {expert}: bytes past record_length")
            record = record[: bank.record_length]
        if len(record) > bank.record_length:
            raise ValueError(f"layer {layer} expert {expert}: {len(record)} bytes, planned at most "
                             f"{bank.record_length}")
        pad = bytes(bank.stride - len(record))
        self._pwrite(record, offset)
        self._pwrite(pad, offset + len(record))  # a resumed write may overwrite old bytes
        hasher = blake3.blake3(record)
        hasher.update(pad)
        digest = hasher.digest()
        self._digests[(layer, expert)] = digest
        return digest

    def _read(self, offset: int, length: int) -> bytes:
        out = bytearray()
        while len(out) < length:
            chunk = os.pread(self._fd, min(_CHUNK, length - len(out)), offset + len(out))
            if not chunk:
                raise FormatError(f"{self.partial}: unexpected end of file at {offset + len(out)}",
                                  "invalid")
            out += chunk
        return bytes(out)

    def _hash_region(self, offset: int, length: int) -> bytes:
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        for pos in range(offset, offset + length, _CHUNK):
            hasher.update(self._read(pos, min(_CHUNK, offset + length - pos)))
        return hasher.digest()

    def _digest_of(self, key: str | tuple[int, int], given: Mapping) -> bytes:
        digest = given.get(key) or self._digests.get(key)
        if digest is None:  # written by another process that did not pass its digest on
            if isinstance(key, tuple):
                bank = self.layout.bank(key[0])
                digest = self._hash_region(bank.record_offset(key[1]), bank.stride)
            else:
                ext = self.layout._by_name[key]
                digest = self._hash_region(ext.offset, ext.length)
        if len(digest) != HASH_SIZE:
            raise ValueError(f"digest for {key!r} has {len(digest)} bytes, not {HASH_SIZE}")
        return bytes(digest)

    def _write_hash_table(self, bank: BankLayout, given: Mapping) -> bytes:
        table = b"".join(self._digest_of((bank.layer, e), given) for e in range(bank.count))
        ext = self.layout.hashes(bank.layer)
        self._pwrite(table, ext.offset)
        return _digest(table)

    def finalize(self, hashes: Mapping[str | tuple[int, int], bytes] | None = None, *,
                 manifest: dict | None = None) -> str:
        """Write hash tables, index and header (last); fsync; rename to the final name.

        `hashes` maps section names and (layer, expert) to BLAKE3 digests returned by write_*
        calls in any process; anything missing is hashed from the file. `manifest` may replace the
        planned one if it serialises to the same length (e.g. source hashes filled in late).
        Returns the container ID (hex root hash).
        """
        given = dict(hashes or {})
        hex_hashes: dict[str, str] = {}
        for bank in self.layout.banks():
            if bank.hashes is not None:  # an MTP bank has a section hash instead
                hex_hashes[bank.hashes] = self._write_hash_table(bank, given).hex()
        for ext in self.layout.sections:
            if ext.type in ("tensor", "blob", *MTP_TYPES):
                hex_hashes[ext.name] = self._digest_of(ext.name, given).hex()
        index = self.layout.index_bytes(hex_hashes, manifest)
        if len(index) != self.layout.index_length:
            raise FormatError(
                f"index is {len(index)} bytes but {self.layout.index_length} were planned "
                "(a replaced manifest must serialise to the same length)", "invalid"
            )
        self._pwrite(index, self.layout.index_offset)
        with naming(self.partial):
            os.fsync(self._fd)  # everything else is durable before the header says "finished"
        root = blake3.blake3(index).digest()
        lay = self.layout
        header = Header(MAJOR, MINOR, lay.flags, lay.alignment, lay.file_size, lay.index_offset,
                        lay.index_length, root)
        self._pwrite(header.pack(), 0)
        with naming(self.partial):
            os.fsync(self._fd)
        self.close()
        self._refuse_existing()
        os.replace(self.partial, self.path)  # replaces a link at path itself, never its target
        fsync_path(self.path.parent)  # make the rename itself durable
        return root.hex()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ContainerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
