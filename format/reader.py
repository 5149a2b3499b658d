"""Container: open and validate a .moepack file (spec/FORMAT.md), then serve its parts zero-copy."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import Any

import blake3
import numpy as np
from moepack.format import codecs
from moepack.format.blobs import decompress_blob
from moepack.format.canonical import parse_canonical
from moepack.format.errors import FormatError, reject
from moepack.format.header import Header, parse_header
from moepack.format.limits import HEADER_SIZE
from moepack.format.mtp import MTP_TENSOR
from moepack.format.rules import check_obj, validate_manifest
from moepack.format.sections import Sections, validate_mtp, validate_sections


def parse_index(data: bytes, h: Header) -> tuple[dict[str, Any], Sections]:
    """Parse and validate index bytes against header `h`: (manifest, sections).

    Does not check the bytes against h.root_hash; callers that trust the header do that first.
    """
    doc = check_obj(parse_canonical(data, "index", h.index_offset), "index")
    for key in ("manifest", "sections"):
        if key not in doc:
            raise reject("missing_key", "index", f"missing key {key!r}")
    return validate_manifest(doc["manifest"]), validate_sections(doc["sections"], h)


def _validate_index(mm: mmap.mmap, h: Header) -> tuple[dict[str, Any], Sections]:
    data = mm[h.index_offset : h.index_offset + h.index_length]
    if blake3.blake3(data).digest() != h.root_hash:
        raise reject("index_hash_mismatch", "header.root_hash",
                     "index hash mismatch (index damaged)", 48)
    return parse_index(data, h)


class Container:
    """A validated, memory-mapped container. Use Container.open(path); close() or `with`."""

    def __init__(self, path: Path, mm: mmap.mmap, header: Header, manifest: dict[str, Any],
                 sections: Sections) -> None:
        self.path = path
        self._open = True
        self._mm = mm
        self._view = memoryview(mm)
        self.header = header
        self.id = header.root_hash.hex()
        self.version = (header.major, header.minor)
        self.alignment = header.alignment
        self.file_size = header.file_size
        self.manifest = manifest
        self.model: dict[str, Any] = manifest["model"]
        self.sections = sections.all
        self._sections = sections
        self._mtp_banks: dict[int, dict[str, Any]] | None = None  # checked on request

    @classmethod
    def open(cls, path: str | os.PathLike) -> Container:
        """Open and fully validate the structure (no payload hashing except the index)."""
        path = Path(path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        mm = None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise reject("not_regular_file", "file",
                             "not a regular file (a directory, device or FIFO)")
            size = st.st_size
            head = os.pread(fd, HEADER_SIZE, 0)
            header = parse_header(head, size)
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            pad = mm[HEADER_SIZE : header.alignment]
            if pad.count(0) != len(pad):
                raise reject("header_padding", "header.padding", "header padding bytes up to "
                             f"the alignment ({header.alignment}) are not zero", HEADER_SIZE)
            manifest, sections = _validate_index(mm, header)
        except BaseException:
            if mm is not None:
                mm.close()
            raise
        finally:
            os.close(fd)  # the map keeps its own reference to the file
        return cls(path, mm, header, manifest, sections)

    # --- sections -------------------------------------------------------------------------

    def _section(self, name: str, kind: str) -> dict[str, Any]:
        s = self._sections.by_name.get(name)
        if s is not None and (s["type"], kind) == (MTP_TENSOR, "tensor"):
            self._mtp()  # read (only on request) like any tensor, once its rules are checked
            return s
        if s is None or s["type"] != kind:
            raise KeyError(f"{self.path}: no {kind} section named {name!r}")
        return s

    def _bytes(self, s: dict[str, Any]) -> memoryview:
        return self._view[s["offset"] : s["offset"] + s["length"]]

    def section_bytes(self, name: str) -> memoryview:
        """Raw stored bytes of any section (what its `hash` covers), zero-copy."""
        s = self._sections.by_name.get(name)
        if s is None:
            raise KeyError(f"{self.path}: no section named {name!r}")
        return self._bytes(s)

    def tensor_names(self) -> list[str]:
        return [s["name"] for s in self.sections if s["type"] == "tensor"]

    def tensor_info(self, name: str) -> dict[str, Any]:
        return self._section(name, "tensor")

    def tensor_bytes(self, name: str) -> memoryview:
        return self._bytes(self._section(name, "tensor"))

    def tensor(self, name: str) -> np.ndarray:
        """The tensor decoded to float32 (codecs.decode reference semantics)."""
        s = self._section(name, "tensor")
        where = f"tensor {name!r} at offset {s['offset']}"
        return self._decode(s["codec"], s["shape"], self._bytes(s), where)

    def _decode(self, codec: dict, shape: list[int], data: memoryview, where: str,
                **refs: np.ndarray | None) -> np.ndarray:
        try:
            return codecs.decode(codec, tuple(shape), data, **refs)
        except FormatError as e:
            raise FormatError(f"{where}: {e}", e.code) from None

    def blob_names(self) -> list[str]:
        return [s["name"] for s in self.sections if s["type"] == "blob"]

    def blob_info(self, name: str) -> dict[str, Any]:
        return self._section(name, "blob")

    def blob(self, name: str) -> bytes:
        """The blob's content, decompressed (never more than its validated raw_length)."""
        s = self._section(name, "blob")
        data = self._bytes(s)
        if s["compression"] == "none":
            return bytes(data)
        return decompress_blob(data, s["raw_length"], f"blob {name!r} at offset {s['offset']}")

    # --- experts --------------------------------------------------------------------------

    def banks(self) -> list[dict[str, Any]]:
        """The expert_bank index entries, in file order."""
        return list(self._sections.banks.values())

    def _mtp(self) -> dict[int, dict[str, Any]]:
        """MTP banks by layer, after the MTP sections' rules (not checked at open, FORMAT.md
        §4.6); FormatError naming the section when one breaks them."""
        if self._mtp_banks is None:
            self._mtp_banks = validate_mtp(self._sections, self.header)
        return self._mtp_banks

    def mtp_banks(self) -> list[dict[str, Any]]:
        """The MTP expert banks (FORMAT.md §4.6), in file order; `banks()` leaves them out."""
        return list(self._mtp().values())

    def mtp_tensor_names(self) -> list[str]:
        self._mtp()
        return [s["name"] for s in self.sections if s["type"] == MTP_TENSOR]

    def bank(self, layer: int) -> dict[str, Any]:
        """The expert bank of `layer`, or its MTP bank (records are read the same way)."""
        b = self._sections.banks.get(layer) or self._mtp().get(layer)
        if b is None:
            raise KeyError(f"{self.path}: no expert bank for layer {layer}")
        return b

    def expert_range(self, layer: int, expert: int) -> tuple[int, int]:
        """(offset, stride): the one aligned read that fetches expert `expert` of `layer`."""
        b = self.bank(layer)
        if not 0 <= expert < b["count"]:
            raise IndexError(f"layer {layer}: expert {expert} outside 0..{b['count'] - 1}")
        return b["offset"] + expert * b["stride"], b["stride"]

    def expert_record(self, layer: int, expert: int) -> memoryview:
        off, stride = self.expert_range(layer, expert)
        return self._view[off : off + stride]

    def expert_hash(self, layer: int, expert: int) -> bytes:
        self.expert_range(layer, expert)
        table = self._section(self.bank(layer)["hashes"], "expert_hashes")
        off = table["offset"] + 32 * expert
        return bytes(self._view[off : off + 32])

    def expert_part_bytes(self, layer: int, expert: int, part: str) -> memoryview:
        p = self._part(layer, part)
        rec = self.expert_record(layer, expert)
        return rec[p["offset"] : p["offset"] + p["length"]]

    def _part(self, layer: int, part: str) -> dict[str, Any]:
        for p in self.bank(layer)["parts"]:
            if p["name"] == part:
                return p
        raise KeyError(f"{self.path}: layer {layer} has no expert part {part!r}")

    def expert_part(self, layer: int, expert: int, part: str) -> np.ndarray:
        """One projection of one expert, decoded to float32 with the layer's codebook."""
        p = self._part(layer, part)
        refs = {}
        for ref in ("codebook", "rotation"):
            name = f"layers.{layer}.experts.{part}.{ref}"
            if name in self._sections.by_name:
                refs[ref] = self.tensor(name)
        data = self.expert_part_bytes(layer, expert, part)
        where = f"layer {layer} expert {expert} part {part!r} at offset " \
            f"{self.expert_range(layer, expert)[0] + p['offset']}"
        return self._decode(p["codec"], p["shape"], data, where, **refs)

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._view.release()
        try:
            self._mm.close()
        except BufferError:
            pass  # views handed out are still alive; the map goes when they do

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Container({str(self.path)!r}, id={self.id[:16]}…)"
