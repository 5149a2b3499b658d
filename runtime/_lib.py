"""Locates and loads the compiled engine library; the C container check with its error code."""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
import re
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


_MODEL_PREFIX = "manifest.model: "  # how the engine's model-description refusals begin
_FIELD_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])*")


@dataclass(frozen=True)
class FormatRefusal:
    """Where a container the engine refused (MP_EFORMAT) breaks the format: code of
    spec/FORMAT.md §11.1, field and byte offset (None where unknown)."""

    code: str
    field: str | None
    offset: int | None


def format_refusal(path: str | os.PathLike, message: str) -> FormatRefusal | None:
    """The stable code, field and offset for the engine's MP_EFORMAT `message` on `path`.

    The engine reports only a number and a message; the C reader's check on the same file says
    which rule the container breaks. When the container itself is well-formed, the engine
    refused its model description (`model_description`), a tensor that description needs
    (`model_tensor`) or something else (`invalid`).
    None when the file can no longer be read (the refusal's cause is then unknown)."""
    check = check_container(path)
    if check.rc != 0:
        if check.code and check.message == message:
            return FormatRefusal(check.code, check.field, check.offset)
        return None  # the file changed or became unreadable since the engine looked at it
    if message.startswith(_MODEL_PREFIX):
        word = message[len(_MODEL_PREFIX):].split(" ", 1)[0].rstrip(":")
        field = "index.manifest.model" + (f".{word}" if _FIELD_PATH.fullmatch(word) else "")
        return FormatRefusal("model_description", field, None)
    if message.startswith("tensor "):
        return FormatRefusal("model_tensor", None, None)
    return FormatRefusal("invalid", None, None)


_AT_OFFSET = re.compile(r" at offset ([0-9]+)")


def damage_refusal(path: str | os.PathLike, damaged: bool, message: str) -> FormatRefusal | None:
    """The stable code for a read that failed after open, or None for a plain I/O failure.

    damaged (MP_ECORRUPT): a record or section whose bytes do not match their BLAKE3
    (FORMAT.md §4, §5): `content_hash`, at the offset the message names. Otherwise (MP_EIO) the
    C reader checks the file again: one shortened or rewritten since open breaks an open-time
    rule now (`file_size_mismatch`, `truncated`, ...), and that rule is the cause."""
    if damaged:
        at = _AT_OFFSET.search(message)
        return FormatRefusal("content_hash", None, int(at.group(1)) if at else None)
    check = check_container(path)
    return FormatRefusal(check.code, check.field, check.offset) if check.code else None
