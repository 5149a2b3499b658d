"""Multi-token-prediction layers (spec/FORMAT.md §4.6): carried as their own section types by
`convert --mtp keep` (the default), left out by `--mtp drop`, ignored by the engine, shown by
`info`, hashed by `verify`, written back by `export`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from damage import flip
from moepack.convert.export import export
from moepack.convert.pipeline import convert
from moepack.convert.settings import Settings
from moepack.format import Container, FormatError
from moepack.format.info import container_info
from moepack.format.mtp import MTP_BANK, MTP_TENSOR
from moepack.runtime.engine import Engine
from moepack.verify import verify
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_models import make_checkpoint, model_class
from typer.testing import CliRunner

from moepack.cli import app

FAST = Settings(expert_preset="rvq3-baseline", iters=3)
LAYERS = 3  # tiny_models' deepseek_v3: layer 0 dense, 1-2 MoE; the MTP layer is layer 3
# What DeepSeek-V3's published checkpoints hold for MTP layer 61 beyond a decoder layer
MTP_ONLY = ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight",
            "shared_head.norm.weight", "shared_head.head.weight")


def _add_mtp_layer(src: Path) -> dict[str, torch.Tensor]:
    """transformers does not build MTP layers, so save_pretrained writes none: write layer
    num_hidden_layers as the published checkpoints do (a copy of the shapes of the last decoder
    layer, MoE, plus MTP_ONLY) into a shard of its own, listed in the index. Returns the
    tensors written."""
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    cfg = json.loads((src / "config.json").read_text())
    h, vocab, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    g = torch.Generator().manual_seed(7)
    like = f"model.layers.{n - 1}."
    out: dict[str, torch.Tensor] = {}
    for name, file in index["weight_map"].items():
        if name.startswith(like):
            with safe_open(src / file, "pt") as f:
                shape = f.get_tensor(name).shape
            out[f"model.layers.{n}." + name[len(like):]] = torch.randn(shape, generator=g)
    shapes = {"embed_tokens.weight": (vocab, h), "enorm.weight": (h,), "hnorm.weight": (h,),
              "eh_proj.weight": (h, 2 * h), "shared_head.norm.weight": (h,),
              "shared_head.head.weight": (vocab, h)}
    for name in MTP_ONLY:
        out[f"model.layers.{n}.{name}"] = torch.randn(shapes[name], generator=g)
    save_file(out, src / "mtp.safetensors")
    index["weight_map"].update({n: "mtp.safetensors" for n in out})
    index_path.write_text(json.dumps(index))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    src = make_checkpoint("deepseek_v3", root / "src", num_nextn_predict_layers=1)
    written = _add_mtp_layer(src)
    keep, drop = root / "keep.moepack", root / "drop.moepack"
    convert(src, keep, FAST)
    convert(src, drop, Settings(expert_preset="rvq3-baseline", iters=3, mtp="drop"))
    return src, written, keep, drop


def _regular(c: Container) -> dict[str, str]:
    """name -> hash of every section that is not MTP (banks: their hash-table's hash)."""
    return {s["name"]: s.get("hash", s.get("hashes")) for s in c.sections
            if s["type"] not in (MTP_TENSOR, MTP_BANK)}


def test_keep_adds_mtp_sections_and_changes_nothing_else(built):
    _, written, keep, drop = built
    with Container.open(keep) as k, Container.open(drop) as d:
        assert not d.mtp_banks() and not d.mtp_tensor_names()
        assert [b["layer"] for b in k.mtp_banks()] == [LAYERS]
        names = set(k.mtp_tensor_names())
        assert {f"layers.{LAYERS}.mtp.{x}" for x in ("embed", "enorm", "hnorm", "eh_proj",
                                                     "head_norm", "head")} <= names
        assert f"layers.{LAYERS}.experts.gate.codebook" in names
        assert not any(n.startswith(f"layers.{LAYERS}.") for n in k.tensor_names())
        assert _regular(k) == _regular(d)  # the same bytes for everything the engine reads
        eh = k.tensor(f"layers.{LAYERS}.mtp.eh_proj")
        want = written[f"model.layers.{LAYERS}.eh_proj.weight"].numpy()
        assert np.abs(eh - want).max() < 0.05 * np.abs(want).max()  # q6 of the source
        skipped = d.manifest["source"]["skipped"]
        assert any("multi-token-prediction" in s and "--mtp drop" in s for s in skipped)
        assert "skipped" not in k.manifest["source"]


def test_engine_ignores_the_section(built):
    _, _, keep, drop = built
    toks = [int(x) for x in np.random.default_rng(1).integers(0, 67, 24)]
    with Engine(str(keep), threads=2) as a, Engine(str(drop), threads=2) as b:
        assert np.array_equal(a.logits(toks), b.logits(toks))
        assert a.plan()["trunk_bytes"] == b.plan()["trunk_bytes"]


def test_info_counts_the_mtp_bytes(built):
    _, _, keep, drop = built
    with Container.open(keep) as k, Container.open(drop) as d:
        ik, idr = container_info(k), container_info(d)
    assert "mtp" not in idr and "mtp" not in idr["bytes"]
    m = ik["mtp"]
    assert m["layers"] == 1 and m["bytes"] == ik["bytes"]["mtp"]
    assert m["bytes"] == sum(s["length"] for s in k.sections if s["type"] in (MTP_TENSOR,
                                                                              MTP_BANK))
    assert sum(ik["bytes"].values()) == ik["file_size"]
    assert ik["parameters"] == idr["parameters"]  # what the engine runs
    assert ik["counts"]["unknown_sections"] == 0


def test_info_command_shows_the_mtp_line(built):
    _, _, keep, drop = built
    runner = CliRunner()
    with Container.open(keep) as k:
        nbytes = container_info(k)["mtp"]["bytes"]
    shown = runner.invoke(app, ["info", str(keep)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert re.search(rf"MTP\s+1 layer, {nbytes:,} bytes", shown.output), shown.output
    assert "MTP" not in runner.invoke(app, ["info", str(drop)]).output


def test_verify_covers_the_mtp_bytes(built, tmp_path):
    _, _, keep, _ = built
    assert verify(keep).ok
    copy = tmp_path / "damaged.moepack"
    copy.write_bytes(keep.read_bytes())
    with Container.open(copy) as c:
        bank = c.mtp_banks()[0]
    flip(copy, bank["offset"] + bank["stride"] + 5)  # inside the second record
    r = verify(copy)
    assert [d.label for d in r.damaged] == [f"section mtp_experts.{LAYERS}"]


def test_export_writes_them_back_and_transformers_loads_it(built, tmp_path):
    src, written, keep, _ = built
    hf = tmp_path / "hf"
    export(keep, hf, shard_bytes=20_000)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    mtp_names = {n for n in index["weight_map"] if n.startswith(f"model.layers.{LAYERS}.")}
    assert mtp_names == set(written)  # every tensor, under the checkpoint's own name
    with Container.open(keep) as c:
        name = f"model.layers.{LAYERS}.mlp.experts.5.down_proj.weight"
        with safe_open(hf / index["weight_map"][name], "np") as f:
            assert np.array_equal(f.get_tensor(name), c.expert_part(LAYERS, 5, "down"))
    model, info = model_class("deepseek_v3").from_pretrained(hf, output_loading_info=True)
    assert not info["missing_keys"]
    # transformers has no MTP layer: it loads the rest and reports these as unexpected
    assert info["unexpected_keys"]
    assert all(k.startswith(f"model.layers.{LAYERS}.") for k in info["unexpected_keys"])
    again = tmp_path / "again.moepack"
    convert(hf, again, FAST)
    with Container.open(again) as c:
        assert [b["layer"] for b in c.mtp_banks()] == [LAYERS]


def test_checkpoint_without_mtp_weights_converts_with_a_note(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path / "src", num_nextn_predict_layers=1)
    out = tmp_path / "out.moepack"
    convert(src, out, FAST)
    with Container.open(out) as c:
        assert not c.mtp_banks()
        assert any("not in the checkpoint" in s for s in c.manifest["source"]["skipped"])


def _rewrite_index(path: Path, edit) -> None:
    """Apply `edit` to the index document, re-serialise and re-hash (a hostile writer)."""
    from moepack.format.canonical import canonical_json
    from moepack.format.header import Header, parse_header

    data = bytearray(path.read_bytes())
    h = parse_header(bytes(data[:128]), len(data))
    doc = json.loads(bytes(data[h.index_offset:]).decode())
    edit(doc)
    index = canonical_json(doc)
    import blake3
    data = data[:h.index_offset] + index
    hdr = Header(h.major, h.minor, h.flags, h.alignment, len(data), h.index_offset,
                 len(index), blake3.blake3(index).digest())
    data[:128] = hdr.pack()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("edit, message, code, at_open", [
    (lambda s: s.update(hashes="expert_hashes.1"), "an MTP bank has no hash table", "bank_hash",
     False),
    (lambda s: s.update(layer=1), "a second bank for layer 1", "second_bank", False),
    (lambda s: s.update(stride=s["stride"] // 2), "stride", "stride", False),
    (lambda s: s.update(hash="00"), "bad hash string", "bad_hash_string", True),
])
def test_reader_rejects_bad_mtp_banks(built, tmp_path, edit, message, code, at_open):
    """Common keys at open (as any section); the MTP rules when the sections are asked for, so
    the C reader, which does not know the types, gives the same verdict at open."""
    from moepack.runtime import _lib

    _, _, keep, _ = built
    copy = tmp_path / "bad.moepack"
    copy.write_bytes(keep.read_bytes())

    def change(doc: dict) -> None:
        edit(next(s for s in doc["sections"] if s["type"] == MTP_BANK))

    _rewrite_index(copy, change)
    assert (_lib.check_container(copy).rc != 0) == at_open
    with pytest.raises(FormatError, match=message) as e:
        with Container.open(copy) as c:
            assert not at_open
            c.mtp_banks()
    assert e.value.code == code
    if not at_open:
        with Container.open(copy) as c, pytest.raises(FormatError, match=message):
            container_info(c)  # info shows them, so it asks


def test_glm4_moe_keeps_and_exports_its_mtp_layer(tmp_path):
    src = make_checkpoint("glm4_moe", tmp_path / "src", num_nextn_predict_layers=1)
    written = _add_mtp_layer(src)
    out, hf = tmp_path / "glm.moepack", tmp_path / "hf"
    convert(src, out, FAST)
    with Container.open(out) as c:
        assert [b["layer"] for b in c.mtp_banks()] == [LAYERS]
        assert f"layers.{LAYERS}.attn.q_bias" in c.mtp_tensor_names()  # GLM's own attention
    export(out, hf, shard_bytes=20_000)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert {n for n in index["weight_map"] if n.startswith(f"model.layers.{LAYERS}.")} \
        == set(written)


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_mtp_layer_keeps_its_indexer(tmp_path, arch):
    """A DSA checkpoint's MTP layer (its last decoder layer, a `full` one, runs its own
    indexer: GLM-5's published checkpoints hold `model.layers.78.self_attn.indexer.*`) is
    carried with that indexer and exported back whole; the engine's description still lists
    the decoder's layers only, and the engine runs the container as without MTP."""
    from dsa_checkpoints import make_dsa_checkpoint

    src = make_dsa_checkpoint(arch, tmp_path / "src", topk=8)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    written = _add_mtp_layer(src)
    n = cfg["num_hidden_layers"]
    out, hf = tmp_path / "dsa.moepack", tmp_path / "hf"
    convert(src, out, FAST)
    with Container.open(out) as c:
        assert [b["layer"] for b in c.mtp_banks()] == [n]
        assert {f"layers.{n}.attn.idx_{x}" for x in ("q", "k", "k_norm", "k_norm_bias",
                                                    "weights")} <= set(c.mtp_tensor_names())
        assert len(c.manifest["model"]["attention"]["dsa"]["indexer_types"]) == n
    export(out, hf, shard_bytes=20_000)
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert {x for x in index["weight_map"] if x.startswith(f"model.layers.{n}.")} == set(written)
    with Engine(str(out), threads=1) as e:
        assert e.logits([3, 5, 7, 11]).shape == (4, cfg["vocab_size"])


def test_minimax_m2_declared_mtp_modules_are_noted_not_converted():
    """MiniMax-M2's Hub config declares 3 MTP modules (`use_mtp`, `num_mtp_modules`) that its
    published checkpoints do not hold: nothing is planned for them and `source.skipped` says so."""
    from moepack.convert.plan import plan_for_config

    cfg = json.loads((Path(__file__).parent.parent / "docs/configs/MiniMax-M2.json").read_text())
    layout = plan_for_config(cfg, Settings())
    assert not [b for b in layout.spec.banks if b.kind != "expert_bank"]
    assert "multi-token-prediction layers 62..64: not converted (MiniMax-M2's published " \
        "checkpoints hold no weights for them)" in layout.spec.manifest["source"]["skipped"]
    layout = plan_for_config({**cfg, "use_mtp": False}, Settings())
    assert "skipped" not in layout.spec.manifest["source"]


def test_convert_refuses_an_unknown_mtp_mode(tmp_path):
    result = CliRunner().invoke(app, ["convert", str(tmp_path), str(tmp_path / "o.moepack"),
                                      "--mtp", "sometimes"])
    assert result.exit_code == 2
    assert "Invalid value for '--mtp': 'sometimes' is not one of keep, drop" in result.output
    assert not (tmp_path / "o.moepack").exists()
