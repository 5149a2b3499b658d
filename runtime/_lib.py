"""Locates and loads the compiled engine library."""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
from pathlib import Path


@functools.cache
def load() -> ctypes.CDLL:
    """Load the engine shared library built by the package build."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_engine{suffix}"
        if candidate.exists():
            lib = ctypes.CDLL(str(candidate))
            lib.mp_version.restype = ctypes.c_char_p
            return lib
    raise RuntimeError(f"moepack engine library not built (looked in {here}); run `make install`")


def version() -> str:
    return load().mp_version().decode()
