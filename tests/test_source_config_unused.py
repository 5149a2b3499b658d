"""The engine reads only the model description (FORMAT.md §7), never the source config kept
verbatim in the manifest: every architecture the engine runs (tests/tiny_containers.py) gives
bit-identical logits after `manifest.source.config` is emptied; and for each family whose
description holds a setting the source config also states (Mixtral's sliding window,
DeepSeek-V3's rope_interleave), different logits when the description's setting itself is
changed (so the setting is read, from there)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from damage import edit_manifest
from moepack.convert.errors import ConvertError
from moepack.convert.plan import described
from moepack.format.reader import Container
from moepack.runtime.engine import Engine
from tiny_containers import ENGINE_ARCHS, tiny_container
from tiny_models import make_checkpoint

# name -> (arch, checkpoint overrides, the description field, a value that changes the model)
CASES: dict[str, tuple[str, dict[str, Any], str, Any]] = {
    "mixtral_window": ("mixtral", dict(max_position_embeddings=64, sliding_window=8),
                       "sliding_window", None),
    # rope dims 8: with 2 (the tiny default) both layouts are the same pair
    "deepseek_v3_rope": ("deepseek_v3", dict(max_position_embeddings=64, qk_rope_head_dim=8,
                                             rope_interleave=False), "rope_interleave", True),
}
TOKENS = [(7 * i + 3) % 50 for i in range(24)]  # longer than the window


def _logits(path: Path) -> np.ndarray:
    with Engine(str(path), threads=1) as e:
        return e.logits(TOKENS)


def _stripped(path: Path, folder: Path) -> Path:
    """A copy of `path` whose manifest.source.config is {}."""
    stripped = folder / "stripped.moepack"
    shutil.copy(path, stripped)
    edit_manifest(stripped, lambda m: m["source"].update(config={}))
    with Container.open(stripped) as c:
        assert c.manifest["source"]["config"] == {}
    return stripped


@pytest.mark.parametrize("arch", ENGINE_ARCHS)
def test_every_family_runs_without_the_source_config(tmp_path: Path, arch: str) -> None:
    path = tiny_container(arch, tmp_path)
    with Container.open(path) as c:
        assert c.manifest["source"]["config"]  # something to remove
    np.testing.assert_array_equal(_logits(_stripped(path, tmp_path)), _logits(path))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_do_not_depend_on_the_source_config(tmp_path: Path, name: str) -> None:
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    arch, overrides, field, other = CASES[name]
    make_checkpoint(arch, tmp_path / "src", **overrides)
    path = tmp_path / "m.moepack"
    convert(tmp_path / "src", path, Settings())
    with Container.open(path) as c:
        source, attention = c.manifest["source"]["config"], c.model["attention"]
    assert attention[field] == source[field] == overrides[field]  # both hold it

    changed = tmp_path / "changed.moepack"
    shutil.copy(path, changed)
    edit_manifest(changed, lambda m: m["model"]["attention"].update({field: other}))

    want = _logits(path)
    np.testing.assert_array_equal(_logits(_stripped(path, tmp_path)), want)
    assert not np.array_equal(_logits(changed), want)


def test_qwen3_sliding_window_is_refused_by_the_converter() -> None:
    """Qwen3-MoE's `use_sliding_window` has no description here: refused before converting."""
    config = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 64, "hidden_size": 16,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 8, "max_position_embeddings": 64, "moe_intermediate_size": 8,
              "num_experts": 4, "num_experts_per_tok": 2, "use_sliding_window": True}
    with pytest.raises(ConvertError, match="'use_sliding_window' is true: sliding-window"):
        described(config)
    described({**config, "use_sliding_window": False})  # the control converts
