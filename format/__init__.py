"""moepack.format: the container format (spec/FORMAT.md) — planner, writer, reader, codecs."""

from moepack.format.errors import FormatError
from moepack.format.layout import (
    BankLayout,
    BankSpec,
    BlobSpec,
    ContainerSpec,
    Extent,
    Layout,
    Part,
    TensorSpec,
    pack_record,
    plan_layout,
)
from moepack.format.reader import Container
from moepack.format.writer import ContainerWriter

__all__ = [
    "BankLayout",
    "BankSpec",
    "BlobSpec",
    "Container",
    "ContainerSpec",
    "ContainerWriter",
    "Extent",
    "FormatError",
    "Layout",
    "Part",
    "TensorSpec",
    "pack_record",
    "plan_layout",
]
