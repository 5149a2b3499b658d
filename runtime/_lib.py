"""Locates and loads the compiled engine library; the C container check with its error code."""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ContainerCheck:
    """The C reader's verdict on a file: rc (0 = opens); for a refusal the stable code of
    spec/FORMAT.md §11.1 (moepack.format.errors.CODES; "" for I/O errors), the field and byte
    offset (None when the message names none, as FormatError.field / .offset) and the message."""

    rc: int
    code: str
    field: str | None
    offset: int | None
    message: str


def check_container(path: str | os.PathLike) -> ContainerCheck:
    """Open and validate `path` with the C reader (runtime/src/container.c), then close it."""
    fn = load().mp_container_check_info
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                   ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p,
                   ctypes.c_size_t]
    fn.restype = ctypes.c_int
    code, field = ctypes.create_string_buffer(64), ctypes.create_string_buffer(768)
    offset, err = ctypes.c_int64(-1), ctypes.create_string_buffer(4096)
    rc = fn(os.fsencode(path), code, len(code), field, len(field), ctypes.byref(offset), err,
            len(err))
    text = field.value.decode("utf-8", "replace")
    return ContainerCheck(rc, code.value.decode("ascii"), text or None,
                          None if offset.value < 0 else offset.value,
                          err.value.decode("utf-8", "replace"))
