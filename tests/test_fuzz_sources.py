"""Hostile sources: garbage config.json and safetensors headers must end in ConvertError (or
plan), never another exception. Bounded for `make test`; MOEPACK_FUZZ_EXAMPLES (as `make fuzz`
sets it for tests/test_fuzz.py) makes the run longer."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from hostile_sources import MIXTRAL, mixtral_tensors, safetensors_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moepack.convert.errors import ConvertError
from moepack.convert.plan import described, plan_for_config
from moepack.convert.settings import Settings
from moepack.convert.source import Checkpoint

EXAMPLES = int(os.environ.get("MOEPACK_FUZZ_EXAMPLES", "60"))
LONG = "MOEPACK_FUZZ_EXAMPLES" in os.environ
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG, database=None,
                suppress_health_check=list(HealthCheck))
EDGE = [0, 1, 2, 3, -1, 7, 8, 4096, 4097, 1 << 17, 1 << 31, 1 << 62, 1 << 63, 10**30,
        0.5, -0.0, 1e-300, 1e300, float("nan"), float("inf"), float("-inf")]
scalars = st.one_of(st.sampled_from(EDGE), st.integers(-(1 << 70), 1 << 70), st.none(),
                    st.booleans(), st.text(max_size=6), st.floats())
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                   st.dictionaries(st.text(max_size=4), c,
                                                                   max_size=4)), max_leaves=8)
KEYS = sorted(MIXTRAL) + ["rope_scaling", "rope_parameters", "n_group", "topk_group",
                          "routed_scaling_factor", "first_k_dense_replace", "moe_layer_freq",
                          "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                          "qk_nope_head_dim", "v_head_dim", "n_routed_experts",
                          "n_shared_experts", "scoring_func", "mlp_only_layers",
                          "decoder_sparse_step", "moe_intermediate_size", "use_sliding_window"]
ARCHS = ["MixtralForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"]
WORKDIR = Path(tempfile.mkdtemp(prefix="moepack-fuzz-src-"))


@FUZZ
@given(arch=st.sampled_from(ARCHS), changes=st.dictionaries(st.sampled_from(KEYS), values,
                                                            max_size=4))
def test_config_values(arch: str, changes: dict[str, Any]) -> None:
    config = {**MIXTRAL, "architectures": [arch], "moe_intermediate_size": 8, "n_group": 1,
              "num_experts": 2, "n_routed_experts": 2, "kv_lora_rank": 8,
              "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 4, **changes}
    try:
        described(config)
        plan_for_config(config, Settings())
    except ConvertError:
        pass


@FUZZ
@given(config=values)
def test_config_of_any_shape(config: Any) -> None:
    try:
        described(config if isinstance(config, dict) else {"architectures": config})
    except ConvertError:
        pass


def _checkpoint(header_raw: bytes, tail: bytes = b"") -> Path:
    src = WORKDIR / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(MIXTRAL))
    (src / "model.safetensors").write_bytes(struct.pack("<Q", len(header_raw)) + header_raw + tail)
    return src


BASE = safetensors_bytes(mixtral_tensors())
BASE_HEADER = BASE[8:8 + struct.unpack("<Q", BASE[:8])[0]]


@FUZZ
@given(entry=st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "x"]), values,
                             max_size=4), name=st.text(max_size=5))
def test_header_entries(entry: dict, name: str) -> None:
    header = json.loads(BASE_HEADER)
    header[name] = entry
    try:
        Checkpoint(_checkpoint(json.dumps(header).encode(), BASE[8 + len(BASE_HEADER):]))
    except ConvertError:
        pass


@FUZZ
@given(flips=st.lists(st.tuples(st.integers(0, len(BASE_HEADER) - 1), st.integers(0, 255)),
                      min_size=1, max_size=6))
def test_header_bytes(flips: list[tuple[int, int]]) -> None:
    raw = bytearray(BASE_HEADER)
    for pos, byte in flips:
        raw[pos] = byte
    try:
        ck = Checkpoint(_checkpoint(bytes(raw), BASE[8 + len(BASE_HEADER):]))
        described(ck.config)
    except ConvertError:
        pass
