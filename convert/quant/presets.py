"""Named codec presets: expert presets (for `--expert-codec`) and trunk codecs per tensor class.

The choice of defaults is measured: see docs/QUANTIZATION.md (bench/quant.py).
"""

from __future__ import annotations

from dataclasses import replace

from moepack.convert.quant.rvq import RvqSettings

_BASELINE = RvqSettings(stages=3, rotation="none", scale="absmax", refit_scale=False, beam=1,
                        iters=10, sample=300_000, refine=0)
# Measured best at 3.0 bits (docs/QUANTIZATION.md): RMS row normalisation, beam search, joint
# refinement, least-squares row scale. The Hadamard rotation lost on heavy-tailed and trained
# weights (it Gaussianises them, and trained 8-dim codebooks exploit the heavy tails), so it is
# off by default and offered as "rvq3-hadamard".
_BEST = RvqSettings(stages=3, rotation="none", scale="rms", refit_scale=True, beam=4,
                    iters=10, sample=300_000, refine=2)

# name -> full encoder settings (RvqSettings fields); the codec object per part comes from
# moepack.convert.quant.rvq.codec_for(settings, shape).
EXPERT_PRESETS: dict[str, dict] = {
    "rvq3": vars(_BEST).copy(),
    "rvq3-baseline": vars(_BASELINE).copy(),
    "rvq3-hadamard": vars(replace(_BEST, rotation="hadamard")).copy(),
    "rvq2": vars(replace(_BEST, stages=2)).copy(),
    "rvq4": vars(replace(_BEST, stages=4)).copy(),
    # A 4th stage where the error costs most, as llama.cpp's Q3_K_M puts ffn_down one step up.
    # Demo model, mean KL (exploratory runs with a q8 trunk, docs/QUALITY.md): rvq3 0.0029; 4
    # stages on down 0.0017, on gate or up 0.0021; on gate and down 0.0012.
    "rvq3-m": vars(replace(_BEST, part_stages=(("down", 4),))).copy(),  # codes: 3.33 bits/weight
    # The default: about Q3_K_M's expert bits on models whose FFN width is a multiple of 256
    # (Q3_K gate/up 3.44 bpw, Q4_K down 4.5), and it beat Q3_K_M on the demo with a smaller file.
    "rvq3-l": vars(replace(_BEST, part_stages=(("down", 4), ("gate", 4)))).copy(),  # codes: 3.67
}
DEFAULT_EXPERT_PRESET = "rvq3-l"

TRUNK_CODECS: dict[str, dict] = {
    "q8": {"name": "q8", "group_size": 32},
    "q6": {"name": "q6", "group_size": 32},
    "q4": {"name": "q4", "group_size": 32, "zero_point": False},
    "q4-zp": {"name": "q4", "group_size": 32, "zero_point": True},
    "q4-g16": {"name": "q4", "group_size": 16, "zero_point": False},
    "q4-g64": {"name": "q4", "group_size": 64, "zero_point": False},
    "q4-zp-g64": {"name": "q4", "group_size": 64, "zero_point": True},
    "f16": {"name": "f16"},
    "bf16": {"name": "bf16"},
    "f32": {"name": "f32"},
}

# tensor class (spec/FORMAT.md §7) -> TRUNK_CODECS name
TRUNK_DEFAULTS: dict[str, str] = {
    # q6 like llama.cpp's Q6_K output tensor: on the demo, q8 -> q6 cost mean KL +0.0003 on the
    # tied embedding and nothing measurable on attention for -0.7 MB (of 7.3), which paid for
    # the gate's 4th stage (-0.0007); on real models a quarter less resident RAM for the trunk
    "attn": "q6",
    "shared_expert": "q6",
    "dense_ffn": "q6",
    "embed": "q6",
    "lm_head": "q6",
    "norm": "f32",
    "router": "f32",
    "bias": "f32",
    "codebook": "f16",  # f32 or f16 only (spec/CODECS.md §3)
}


def expert_settings(preset: str) -> RvqSettings:
    """RvqSettings of a named expert preset (ValueError listing the names otherwise)."""
    try:
        return RvqSettings(**EXPERT_PRESETS[preset])
    except KeyError:
        raise ValueError(
            f"unknown expert codec {preset!r}; choose one of {sorted(EXPERT_PRESETS)}"
        ) from None
