"""Numeric limits of spec/FORMAT.md, in one place so the planner, writer and reader agree."""

from __future__ import annotations

MAGIC = b"MOEPACK\x00"
MAJOR = 1
MINOR = 1
HEADER_SIZE = 128
HASH_SIZE = 32

MIN_ALIGNMENT = 512
MAX_ALIGNMENT = 1 << 24
DEFAULT_ALIGNMENT = 4096
SECTION_ALIGNMENT = 64  # every non-bank section, every part inside a record, and the index

MAX_U63 = (1 << 63) - 1  # offsets, lengths and sizes
MAX_INDEX_LENGTH = 64 << 20
MIN_INDEX_LENGTH = 2
MAX_JSON_DEPTH = 64
MAX_SECTIONS = 1_000_000
MAX_NAME_BYTES = 512
MAX_DIMS = 4
MAX_DIM = (1 << 31) - 1
MAX_ELEMENTS = 1 << 40
MAX_EXPERTS = 65_536
MAX_LAYER = (1 << 31) - 1
MAX_BLOB_RAW = 1 << 30
REQUIRED_FLAGS_MASK = 0x0000FFFF  # bits 0-15: required features
FLAG_RVQ_TILED = 0x0001  # bit 0 (1.1): rvq codes in 64-row tiles; a file with rvq parts needs it
KNOWN_REQUIRED_FLAGS = FLAG_RVQ_TILED
BANK_PARTS = ("gate", "up", "down")


def align_up(x: int, a: int) -> int:
    """Smallest multiple of `a` that is >= `x` (a > 0)."""
    return (x + a - 1) // a * a
