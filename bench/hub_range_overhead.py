"""Range traffic of `convert hf: --ray` tasks on a DeepSeek-V3-shaped shard (issue 19).

Writes one shard holding one MoE layer as DeepSeek-V3's fp8 checkpoint stores it (attention
projections and experts in fp8 with their f32 `weight_scale_inv` grids, norms and router in
bf16), serves it from the fake hub on loopback, runs the driver's streamed pass, then reads
every tensor through `RangeCheckpoint` as the tasks do: one task per trunk tensor, one codebook
task per projection reading it for every expert, one expert task reading gate, up, down of each
expert in turn (so each expert projection is read twice). Each task starts on a fresh worker
(no blocks kept from another task: the least sharing). Prints the bytes fetched by range
requests against the source and against what the reads asked for (the block rounding), with
the worker's kept end blocks (cluster_hub.KEPT_BLOCKS) and without. No conversion runs: this
measures the reading layer only.

    .venv/bin/python bench/hub_range_overhead.py [--experts 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moepack.convert.cluster_hub import RangeCheckpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

BLOCK = [128, 128]
HIDDEN, INTER = 7168, 2048           # DeepSeek-V3 hidden size, expert intermediate size
TRUNK_FP8 = {                        # self_attn projections: (rows, cols)
    "self_attn.q_a_proj": (1536, HIDDEN),
    "self_attn.q_b_proj": (24576, 1536),
    "self_attn.kv_a_proj_with_mqa": (576, HIDDEN),
    "self_attn.kv_b_proj": (32768, 512),
    "self_attn.o_proj": (HIDDEN, 16384),
}


def layer_tensors(experts: int) -> tuple[dict, list[str], list[str]]:
    """(tensors, trunk weight names, expert weight names) of one MoE layer."""
    import torch

    g = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}

    def fp8(name: str, rows: int, cols: int) -> None:
        w = torch.randn(rows, cols, generator=g) * 0.02
        out[f"{name}.weight"] = w.to(torch.float8_e4m3fn)
        out[f"{name}.weight_scale_inv"] = torch.rand(-(-rows // 128), -(-cols // 128),
                                                     generator=g) + 0.5
    p = "model.layers.3."
    for name, (rows, cols) in TRUNK_FP8.items():
        fp8(p + name, rows, cols)
    for e in range(experts):
        for proj, (rows, cols) in (("gate_proj", (INTER, HIDDEN)), ("up_proj", (INTER, HIDDEN)),
                                   ("down_proj", (HIDDEN, INTER))):
            fp8(f"{p}mlp.experts.{e}.{proj}", rows, cols)
    for name, shape in (("input_layernorm.weight", (HIDDEN,)),
                        ("post_attention_layernorm.weight", (HIDDEN,)),
                        ("self_attn.q_a_layernorm.weight", (1536,)),
                        ("self_attn.kv_a_layernorm.weight", (512,)),
                        ("mlp.gate.weight", (256, HIDDEN))):
        out[p + name] = (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
    trunk = [p + n + ".weight" for n in TRUNK_FP8] + [
        p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                        "self_attn.q_a_layernorm.weight", "self_attn.kv_a_layernorm.weight",
                        "mlp.gate.weight")]
    expert_names = [n for n in out if ".experts." in n and n.endswith(".weight")]
    return out, trunk, expert_names


def task_reads(trunk: list[str], experts: list[str]) -> list[list[str]]:
    """The tensors each task reads, in order (codebook tasks, then the expert task)."""
    by_expert: dict[str, dict[str, str]] = {}
    for name in experts:
        e, proj = name.split(".experts.")[1].split(".")[:2]
        by_expert.setdefault(e, {})[proj.removesuffix("_proj")] = name
    order = sorted(by_expert, key=int)
    parts = ("gate", "up", "down")
    return ([[n] for n in trunk] + [[by_expert[e][p] for e in order] for p in parts]
            + [[by_expert[e][p] for e in order for p in parts]])


def measure(ck: RangeCheckpoint, tasks: list[list[str]]) -> tuple[int, int, float]:
    """(bytes asked, bytes fetched, seconds) reading `tasks`, each on a fresh worker."""
    from moepack.convert.source import SourceRef

    asked = fetched = 0
    t0 = time.monotonic()
    for names in tasks:
        ck.kept.clear()
        for name in names:
            ck.read(SourceRef(name))
            info = ck.info(name)
            asked += info.end - info.start
            if name.endswith("proj.weight"):
                scale = ck.info(name.removesuffix("weight") + "weight_scale_inv")
                asked += scale.end - scale.start
        fetched += ck.take_fetched()
    return asked, fetched, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", type=int, default=4)
    args = ap.parse_args()

    from moepack.convert import cluster_hub
    from moepack.convert.cluster_hub import (
        KEPT_BLOCKS,
        RangeCheckpoint,
        _header_folder,
        header_folder_path,
    )
    from moepack.convert.hub_ranges import stream_digests
    from range_server import RangeServer
    from safetensors.torch import save_file

    from moepack.safefs import remove_created

    shard = "model-00001-of-00001.safetensors"
    with tempfile.TemporaryDirectory() as tmp:
        tensors, trunk, experts = layer_tensors(args.experts)
        save_file(tensors, str(Path(tmp) / shard))
        data = (Path(tmp) / shard).read_bytes()
    config = {"model_type": "deepseek_v3",
              "quantization_config": {"quant_method": "fp8", "weight_block_size": BLOCK}}
    index = {"weight_map": dict.fromkeys(tensors, shard)}
    with RangeServer({shard: data}) as server:
        t0 = time.monotonic()
        table = stream_digests(server.url(shard), shard, len(data),
                               hashlib.sha256(data).hexdigest(), data[:8])
        stream_s = time.monotonic() - t0
        small = {"config.json": json.dumps(config).encode(),
                 "model.safetensors.index.json": json.dumps(index).encode()}
        bulk = {n: (b, len(b)) for n, b in small.items()}
        folder = header_folder_path("bench", str(time.time_ns()))
        # the shard's stand-in: its header at the shard's size, as the driver sends it
        bulk[shard] = (data[:8 + struct.unpack("<Q", data[:8])[0]], len(data))
        tasks = task_reads(trunk, experts)
        result: dict[str, object] = {"shard_bytes": len(data), "block": table.block,
                                     "experts": args.experts, "tasks": len(tasks),
                                     "stream_s": round(stream_s, 2)}
        try:
            ck = RangeCheckpoint(_header_folder(folder, bulk), {shard: server.url(shard)}, None)
            ck.tables[shard] = table
            for label, kept in (("no_kept_blocks", 0), ("kept_blocks", KEPT_BLOCKS)):
                cluster_hub.KEPT_BLOCKS = kept
                asked, fetched, seconds = measure(ck, tasks)
                result[label] = {"asked_bytes": asked, "fetched_bytes": fetched,
                                 "rounding_overhead_pct": round(100 * (fetched - asked) / asked,
                                                                2),
                                 "fetched_over_source": round(fetched / len(data), 3),
                                 "read_s": round(seconds, 2)}
        finally:
            cluster_hub.KEPT_BLOCKS = KEPT_BLOCKS
            remove_created(folder, list(bulk))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
