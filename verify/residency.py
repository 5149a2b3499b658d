"""How much of a file is in the page cache, by sampling mincore(2) over a read-only mapping.

Decides the read mode: a cached file is verified fastest from RAM (buffered), an uncached one
with O_DIRECT (measured here: cold buffered reads reached half the O_DIRECT speed and cost ~2x
the CPU per byte). Mapping a file only reserves address space; mincore does not touch the pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

_SAMPLES = 64
_WINDOW_PAGES = 64  # pages per sample: 256 KiB with 4 KiB pages


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


def cached_fraction(path: str | Path, start: int, end: int) -> float | None:
    """Fraction of sampled pages of [start, end) that are resident; None when unknown."""
    if end <= start or not hasattr(mmap, "PROT_READ"):
        return None
    libc = _libc()
    if libc is None:
        return None
    page = mmap.PAGESIZE
    first, last = start // page, (end - 1) // page
    npages = last - first + 1
    length = npages * page
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, first * page)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            window = min(_WINDOW_PAGES, npages)
            vec = (ctypes.c_ubyte * window)()
            resident = checked = 0
            for i in range(min(_SAMPLES, npages)):
                p = (npages - window) * i // max(1, min(_SAMPLES, npages) - 1)
                if libc.mincore(addr + p * page, window * page, vec) != 0:
                    return None
                resident += sum(b & 1 for b in vec)
                checked += window
        finally:
            libc.munmap(addr, length)
    finally:
        os.close(fd)
    return resident / checked if checked else None
