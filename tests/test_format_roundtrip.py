"""Write/read round trips of the container format, including several writer processes."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import blake3
import numpy as np
import pytest
from moepack.format import Container, ContainerWriter, FormatError, codecs, pack_record, plan_layout
from moepack.format.limits import FLAG_RVQ_TILED
from moepack.format.synthetic import encode_synthetic, mixtral_spec, write_synthetic
from moepack.format.writer import partial_path


def _write_layers(path: str, spec, layers: list[int]) -> dict:
    """One worker: attach to the partial file and write the expert banks of `layers`."""
    layout = plan_layout(spec)
    digests = {}
    with ContainerWriter(path, layout, create=False) as w:
        for L in layers:
            bank = layout.bank(L)
            for e in range(bank.count):
                parts = {p.name: encode_synthetic(p.codec, p.shape, f"s:{L}:{e}:{p.name}")
                         for p in bank.parts}
                digests[(L, e)] = w.write_expert(L, e, pack_record(bank, parts))
    return digests


def test_multiprocess_round_trip(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=4, experts=5, alignment=512)
    layout = plan_layout(spec)
    path = tmp_path / "m.moepack"
    main = ContainerWriter(path, layout)
    trunk = {t.name: encode_synthetic(t.codec, t.shape, f"s:{t.name}") for t in spec.tensors}
    digests: dict = {name: main.write_tensor(name, data) for name, data in trunk.items()}
    ctx = mp.get_context("spawn")  # fork is unsafe once other tests have started threads
    with ctx.Pool(2) as pool:
        jobs = [(str(path), spec, [0, 2]), (str(path), spec, [1, 3])]
        results = pool.starmap(_write_layers, jobs)
    for r in results:
        digests.update(r)
    del digests[(3, 4)]  # a digest that never arrived is re-read from the file
    cid = main.finalize(digests)
    assert not partial_path(path).exists()
    assert path.stat().st_size == layout.file_size
    with Container.open(path) as c:
        assert c.id == cid
        assert c.version == (1, 1)
        assert c.header.flags == FLAG_RVQ_TILED  # rvq experts: codes in 64-row tiles
        assert c.model["arch"] == "mixtral"
        for name, data in trunk.items():
            assert bytes(c.tensor_bytes(name)) == data
        for L in range(4):
            bank = layout.bank(L)
            for e in range(5):
                off, stride = c.expert_range(L, e)
                assert (off, stride) == (bank.record_offset(e), bank.stride)
                assert off % 512 == 0 and stride % 512 == 0
                rec = bytes(c.expert_record(L, e))
                p = bank.parts[2]
                want = encode_synthetic(p.codec, p.shape, f"s:{L}:{e}:down")
                assert rec[p.offset : p.offset + p.length] == want
                assert rec[bank.record_length :] == bytes(stride - bank.record_length)
                assert c.expert_hash(L, e) == blake3.blake3(rec).digest()
        if hasattr(codecs, "decode"):  # the reference decoders land with the codec work
            np.testing.assert_array_equal(
                c.tensor("layers.1.attn_norm"),
                np.frombuffer(trunk["layers.1.attn_norm"], "<f4"),
            )
            assert c.expert_part(2, 3, "up").shape == (32, 64)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"alignment": 512, "layers": 3, "experts": 7},
        {"alignment": 65536, "layers": 1, "experts": 2},
        {"hidden": 40, "inter": 24, "vocab": 97, "heads": 5, "kv_heads": 1, "alignment": 1024},
        {"layers": 1, "experts": 64, "hidden": 16, "inter": 8, "alignment": 512},
    ],
)
def test_planned_size_equals_written_size(tmp_path: Path, kwargs: dict) -> None:
    blobs = {"tokenizer.json": b'{"version":"1.0"}' * 7}
    spec = mixtral_spec(blobs={"tokenizer.json": (len(blobs["tokenizer.json"]), "none",
                                                  len(blobs["tokenizer.json"]))}, **kwargs)
    layout = plan_layout(spec)
    path = tmp_path / "s.moepack"
    write_synthetic(path, spec, blobs)
    assert path.stat().st_size == layout.file_size
    with Container.open(path) as c:
        assert [s["offset"] for s in c.sections] == [x.offset for x in layout.sections]
        assert c.blob("tokenizer.json") == blobs["tokenizer.json"]


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    path = tmp_path / "o.moepack"
    first = write_synthetic(path, spec)
    with pytest.raises(FileExistsError):
        write_synthetic(path, spec, seed="other")
    with Container.open(path) as c:
        assert c.id == first
    second = write_synthetic(path, spec, seed="other", overwrite=True)
    assert second != first
    with Container.open(path) as c:
        assert c.id == second


def test_unfinished_partial_is_recognised(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    layout = plan_layout(spec)
    path = tmp_path / "u.moepack"
    w = ContainerWriter(path, layout)
    w.write_tensor("embed", encode_synthetic(spec.tensors[0].codec, spec.tensors[0].shape, "x"))
    w.close()
    part = partial_path(path)
    assert part.stat().st_size == layout.file_size
    with pytest.raises(FormatError, match="unfinished conversion"):
        Container.open(part)


def test_writer_checks_lengths_and_attach(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    layout = plan_layout(spec)
    path = tmp_path / "l.moepack"
    with ContainerWriter(path, layout) as w:
        with pytest.raises(ValueError, match="planned"):
            w.write_tensor("embed", b"short")
        with pytest.raises(ValueError, match="planned"):
            w.write_expert(0, 0, b"x" * (layout.bank(0).record_length + 1))
        with pytest.raises(IndexError):
            w.write_expert(0, 2, b"")
        with pytest.raises(KeyError):
            w.write_tensor("no.such.tensor", b"")
    os.truncate(partial_path(path), layout.file_size - 1)
    with pytest.raises(FormatError, match="planned file size"):
        ContainerWriter(path, layout, create=False)
