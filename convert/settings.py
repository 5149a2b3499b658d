"""Conversion settings: everything that influences the container's bytes (recorded in the
manifest and in the journal, so a resumed run can refuse different settings)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from moepack.convert.errors import ConvertError
from moepack.convert.quant import (
    DEFAULT_EXPERT_PRESET,
    EXPERT_PRESETS,
    TRUNK_CODECS,
    TRUNK_DEFAULTS,
    RvqSettings,
    expert_settings,
)
from moepack.format.limits import DEFAULT_ALIGNMENT
from moepack.format.rules import CLASS_CODECS

EXPERT_PARTS_CLASS = "expert"
FLOAT_ONLY = ("f32", "f16", "bf16")
MTP_MODES = ("keep", "drop")  # 1-D tensors (norms, biases) cannot take group codecs


@dataclass(frozen=True)
class Settings:
    expert_preset: str = DEFAULT_EXPERT_PRESET
    trunk: tuple[tuple[str, str], ...] = ()  # (class, TRUNK_CODECS name) overriding defaults
    seed: int = 0
    alignment: int = DEFAULT_ALIGNMENT
    sample: int | None = None  # override of the preset's training sample size (vectors)
    iters: int | None = None   # override of the preset's Lloyd iterations
    mtp: str = "keep"  # multi-token-prediction layers: "keep" (when present) or "drop"

    def __post_init__(self) -> None:
        if self.mtp not in MTP_MODES:
            raise ConvertError(f"--mtp must be one of {', '.join(MTP_MODES)}, got {self.mtp!r}")
        if self.expert_preset not in EXPERT_PRESETS:
            raise ConvertError(f"unknown expert codec {self.expert_preset!r}; choose one of "
                               f"{', '.join(sorted(EXPERT_PRESETS))}")
        for cls, name in self.trunk:
            if name not in TRUNK_CODECS:
                raise ConvertError(f"unknown codec {name!r} for class {cls!r}; choose one of "
                                   f"{', '.join(sorted(TRUNK_CODECS))}")
            if cls not in TRUNK_DEFAULTS:
                raise ConvertError(f"unknown tensor class {cls!r}; classes: "
                                   f"{', '.join(sorted(TRUNK_DEFAULTS))}")
            allowed = CLASS_CODECS.get(cls)
            if allowed is not None and TRUNK_CODECS[name]["name"] not in allowed:
                raise ConvertError(f"codec {name!r} is not allowed for class {cls!r}; choose one "
                                   f"of {', '.join(allowed)}")

    @property
    def rvq(self) -> RvqSettings:
        s = expert_settings(self.expert_preset)
        if self.sample is not None:
            s = replace(s, sample=self.sample)
        if self.iters is not None:
            s = replace(s, iters=self.iters)
        return s

    def trunk_codec(self, cls: str, ndim: int) -> dict:
        """Codec object for a trunk tensor of class `cls` and rank `ndim`."""
        name = dict(self.trunk).get(cls) or TRUNK_DEFAULTS.get(cls, "f32")
        if ndim != 2 and name not in FLOAT_ONLY:
            name = "f32"  # group codecs are defined for 2-D tensors only (FORMAT.md §8)
        return dict(TRUNK_CODECS[name])

    def as_manifest(self) -> dict:
        """Every byte-influencing setting (manifest.converter.settings)."""
        classes = {cls: dict(self.trunk).get(cls) or name for cls, name in TRUNK_DEFAULTS.items()}
        out = {"expert_codec": self.expert_preset, "expert": self.rvq.manifest(),
               "trunk": {c: TRUNK_CODECS[n] for c, n in sorted(classes.items())},
               "seed": self.seed, "alignment": self.alignment}
        if self.mtp != "keep":  # the default leaves containers without MTP layers unchanged
            out["mtp"] = self.mtp
        return out
