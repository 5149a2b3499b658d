"""What a container verification found: `Report` with its `Damage` items."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

# Damage.kind values; `section` is a section of a type this version does not know.
KINDS = ("header", "index", "tensor", "blob", "expert_hashes", "expert", "section", "padding")


@dataclass(frozen=True)
class Damage:
    """A damaged item: `kind` (see KINDS), `name`, byte range [offset, offset + length).

    `code` is the stable code of the finding (moepack.format.errors.CODES, FORMAT.md §11.1):
    `content_hash` for bytes that do not match their BLAKE3, the open-time rule's code for
    structural damage, None for a plain I/O failure.
    """

    kind: str
    name: str
    offset: int
    length: int
    detail: str = ""
    code: str | None = None

    @property
    def label(self) -> str:
        """How a person names it: `layer 12 expert 37`, `tensor layers.3.attn.q`, `padding`."""
        if self.kind in ("tensor", "blob", "section"):
            return f"{self.kind} {self.name}"
        return self.name

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


@dataclass
class Report:
    """Result of `verify()`. `error` set = not verifiable (exit 2); damage listed = exit 1."""

    path: str
    quick: bool = False
    container_id: str | None = None
    items_checked: int = 0
    bytes_checked: int = 0
    seconds: float = 0.0
    damaged: list[Damage] = field(default_factory=list)
    error: str | None = None
    error_code: str | None = None  # the error's stable code, where the file breaks a format rule
    notes: list[str] = field(default_factory=list)
    direct_io: bool = False
    # The ID an intact header names when `container_id` cannot vouch for it (a truncated or
    # appended copy): unverified, but it says which container the file was meant to be.
    claimed_container_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.damaged

    @property
    def gb_per_s(self) -> float:
        return self.bytes_checked / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def exit_code(self) -> int:
        return 2 if self.error is not None else (1 if self.damaged else 0)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["damaged"] = [d.to_dict() for d in self.damaged]
        out.update(ok=self.ok, gb_per_s=round(self.gb_per_s, 3), exit_code=self.exit_code)
        return out

    @classmethod
    def unverifiable(cls, path: str | Path, message: str, *, code: str | None = None,
                     quick: bool = False) -> Report:
        return cls(path=str(path), quick=quick, error=message, error_code=code)
