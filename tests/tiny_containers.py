"""One tiny converted container per architecture the engine runs, for the tests that go over
every family (tests/test_source_config_unused.py, tests/test_runtime_engine_asan.py): each
family's source checkpoint comes from the builder its own tests use, converted with the default
settings."""

from __future__ import annotations

from pathlib import Path

from tiny_models import ARCHS, make_checkpoint

DSA_ARCHS = ("deepseek_v32", "glm_moe_dsa")
ENGINE_ARCHS = (*ARCHS, *DSA_ARCHS, "kimi_k3", "glm5_next")


def tiny_source(arch: str, src: Path) -> Path:
    """`arch`'s tiny random checkpoint written to `src`."""
    if arch in ARCHS:  # Kimi K2.5 with INT4 pack-quantized experts, as published
        return make_checkpoint(arch, src, **({"int4_group": 4} if arch == "kimi_k25" else {}))
    if arch in DSA_ARCHS:  # index_topk 8: sparse from position 8 on
        from dsa_checkpoints import make_dsa_checkpoint

        return make_dsa_checkpoint(arch, src, topk=8)
    if arch == "kimi_k3":
        from k3_checkpoint import make_k3_checkpoint

        return make_k3_checkpoint(src)
    if arch == "glm5_next":  # KDA + k-pool DSA (shared layer too), sparse from position 14 on
        from dsa_checkpoints import make_hybrid_checkpoint

        return make_hybrid_checkpoint(src)
    raise ValueError(f"no tiny checkpoint for {arch!r}")


def tiny_container(arch: str, folder: Path) -> Path:
    """`arch`'s tiny checkpoint (folder/src) converted to folder/m.moepack."""
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    tiny_source(arch, folder / "src")
    convert(folder / "src", folder / "m.moepack", Settings())
    return folder / "m.moepack"
