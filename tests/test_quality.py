"""bench/kl.py statistics against hand-computed values, bench/quality.py windows, and one small
end-to-end run: a tiny random Mixtral's container against its transformers original, and against
its own export (which must give KL ~ 0)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from tiny_models import make_checkpoint

from bench import kl
from bench.quality import evaluate, fmt_kl, make_windows


# ------------------------------------------------------------------------------------ kl.py
def test_two_token_distribution_by_hand():
    # P = (1/2, 1/2); Q = softmax(0, ln 3) = (1/4, 3/4)
    ref = np.array([[0.0, 0.0]], dtype=np.float32)
    q = np.array([[0.0, math.log(3.0)]], dtype=np.float32)
    s = kl.position_stats(ref, q, [0])
    assert s["kl"][0] == pytest.approx(0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75),
                                       rel=1e-7)
    assert s["kl"][0] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-7)
    assert s["top1"][0] == 0.0  # argmax P = 0 (first of a tie), argmax Q = 1
    assert s["nll_ref"][0] == pytest.approx(math.log(2), rel=1e-7)
    assert s["nll_q"][0] == pytest.approx(math.log(4), rel=1e-7)
    assert s["dp"][0] == pytest.approx(-0.25, rel=1e-6)


def test_kl_zero_for_same_distribution_and_shift_invariant():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(5, 50)).astype(np.float32) * 4
    s = kl.position_stats(ref, ref + 7.5, rng.integers(0, 50, 5))
    assert np.all(s["kl"] < 1e-12)
    assert np.all(s["top1"] == 1.0)
    assert np.allclose(s["nll_ref"], s["nll_q"], atol=1e-5)


def test_extreme_logits_stay_finite():
    ref = np.array([[1000.0, 0.0, -1000.0]])
    q = np.array([[0.0, 1000.0, -1000.0]])
    s = kl.position_stats(ref, q, [2])
    assert s["kl"][0] == pytest.approx(1000.0)  # P = (1, 0, 0): ln 1 − ln e^-1000
    assert s["nll_ref"][0] == pytest.approx(2000.0)
    assert all(np.isfinite(v).all() for v in s.values())


def test_three_way_kl_by_hand():
    p = np.array([0.7, 0.2, 0.1])
    qd = np.array([0.5, 0.3, 0.2])
    s = kl.position_stats(np.log(p)[None], np.log(qd)[None] + 3.0, [1])
    want = sum(a * math.log(a / b) for a, b in zip(p, qd, strict=True))
    assert s["kl"][0] == pytest.approx(want, rel=1e-12)
    assert s["top1"][0] == 1.0
    assert s["dp"][0] == pytest.approx(0.1)


def test_summary_by_hand():
    n = 100
    s = {"kl": np.arange(n, dtype=np.float64), "top1": np.array([1.0] * 75 + [0.0] * 25),
         "nll_ref": np.full(n, math.log(2)), "nll_q": np.full(n, math.log(3)),
         "dp": np.full(n, 0.1)}
    r = kl.summarize(s)
    assert r["positions"] == 100
    assert r["kl_mean"] == pytest.approx(49.5)
    assert r["kl_median"] == pytest.approx(49.5)
    assert r["kl_p99"] == pytest.approx(98.01)  # linear interpolation: 98 + 0.01·(99 − 98)
    assert r["kl_max"] == 99.0
    assert r["kl_mean_se"] == pytest.approx(np.std(np.arange(n), ddof=1) / 10)
    assert r["top1"] == 0.75
    assert r["top1_se"] == pytest.approx(math.sqrt(0.75 * 0.25 * 100 / 99) / 10)
    assert r["ppl_ref"] == pytest.approx(2.0)
    assert r["ppl_q"] == pytest.approx(3.0)
    assert r["ppl_ratio"] == pytest.approx(1.5)
    assert r["rms_dp"] == pytest.approx(0.1)


def test_concat_and_errors():
    a = kl.position_stats(np.zeros((2, 3)), np.zeros((2, 3)), [0, 1])
    b = kl.position_stats(np.zeros((1, 3)), np.ones((1, 3)), [2])
    assert kl.concat([a, b])["kl"].shape == (3,)
    with pytest.raises(ValueError):
        kl.position_stats(np.zeros((2, 3)), np.zeros((2, 4)), [0, 1])
    with pytest.raises(ValueError):
        kl.position_stats(np.zeros((2, 3)), np.zeros((2, 3)), [0])
    with pytest.raises(ValueError):
        kl.position_stats(np.full((1, 3), np.nan), np.zeros((1, 3)), [0])
    with pytest.raises(ValueError):
        kl.summarize(kl.concat([]))


# ------------------------------------------------------------------------------------ windows
def test_windows_like_llama_perplexity():
    w = make_windows(list(range(10)), bos=99, ctx=4)
    assert w.tokens.tolist() == [[99, 0, 1, 2], [99, 3, 4, 5], [99, 6, 7, 8]]
    assert w.first == 2 and w.targets.tolist() == [[2], [5], [8]] and w.positions == 3
    w = make_windows(list(range(10)), bos=99, ctx=4, first=0, max_windows=2)
    assert w.targets.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError):
        make_windows([1, 2], bos=0, ctx=4)


def test_fmt_kl():
    assert fmt_kl(0.02214) == "0.0221"
    assert fmt_kl(3.2e-7) == "3.2e-07"
    assert fmt_kl(0.0) == "0.0000"


# ------------------------------------------------------------------------------------ end to end
def test_container_against_original_and_own_export(tmp_path):
    from moepack.convert.export import export
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings

    src = make_checkpoint("mixtral", tmp_path / "src", num_experts_per_tok=2)
    convert(src, tmp_path / "m.moepack", Settings())
    export(tmp_path / "m.moepack", tmp_path / "hf")
    shutil.copy(src / "tokenizer.json", tmp_path / "hf" / "tokenizer.json")
    rng = np.random.default_rng(1)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"w{i}" for i in rng.integers(3, 67, 200)))

    r = evaluate(tmp_path / "m.moepack", src, text, ctx=24, max_windows=4, threads=1)
    assert r["positions"] == 4 * 11 and r["windows"] == 4 and r["text_tokens"] == 200
    for k in ("kl_mean", "kl_median", "kl_p99", "top1", "ppl_ref", "ppl_q", "ppl_ratio"):
        assert math.isfinite(r[k]), k
    assert r["kl_mean"] > 0 and 0 <= r["top1"] <= 1
    assert r["file_size"] > 0 and r["bpw_experts"] > 3

    # the engine against transformers on the container's own dequantised weights: same model
    s = evaluate(tmp_path / "m.moepack", tmp_path / "hf", text, ctx=24, max_windows=4, threads=1)
    assert s["kl_mean"] < 1e-7 and s["kl_max"] < 1e-6
    assert s["ppl_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert s["top1"] >= 0.97  # a random tiny model may have near-ties


def test_doc_render_and_verdict(tmp_path):
    from bench.quality import DEFAULT_ROW, END, write_doc, write_summary

    def row(kl_mean, top1, size, group="experts"):
        return {"kl_mean": kl_mean, "kl_mean_se": 1e-5, "kl_median": kl_mean, "kl_p99": kl_mean,
                "top1": top1, "ppl_ref": 10.0, "ppl_q": 10.1, "ppl_ratio": 1.01,
                "file_size": size, "weight_bytes": size - 100, "bpw": 4.0, "bpw_experts": 3.0,
                "group": group}

    data = {"env": {"date": "D", "commit": "C", "cpu": "X", "python": "3", "versions": {}},
            "text": {"file": "t", "bytes": 1, "text_tokens": 2, "windows": 1, "ctx": 8,
                     "first": 4, "positions": 3},
            "model": {"dir": "m", "architecture": "A", "layers": 1, "experts": 2, "top_k": 1,
                      "hidden": 4, "intermediate": 4, "vocab": 9, "parameters": 5,
                      "dtypes": ["BF16"]},
            "rows": {DEFAULT_ROW: row(0.001, 0.97, 1000)},
            "llama": {"rows": {"Q3_K_M vs llama.cpp F32": row(0.002, 0.96, 2000),
                               "Q4_K_M vs llama.cpp F32": row(0.0005, 0.98, 3000)},
                      "notes": []}}
    doc = tmp_path / "Q.md"
    write_doc(data, doc)
    text = doc.read_text()
    assert "with a smaller file): **met**" in text and "Moonshot" in text and END in text
    summary = tmp_path / "S.md"
    summary.write_text("intro\n<!-- quality-summary:begin (bench/quality.py) -->\nold\n"
                       "<!-- quality-summary:end -->\nafter\n")
    write_summary(data, summary)
    short = summary.read_text()
    assert short.startswith("intro\n") and short.endswith("after\n") and "old" not in short
    assert f"| {DEFAULT_ROW} | 0.00 | 3.00 | 0.0010 | 97.00 |" in short
    assert "| llama.cpp Q3_K_M vs llama.cpp F32 | 0.00 | 3.00 | 0.0020 | 96.00 |" in short
    doc.write_text(text + "hand-written\n")
    data["rows"][DEFAULT_ROW]["file_size"] = 5000
    write_doc(data, doc)
    text = doc.read_text()
    assert "with a smaller file): **not met**" in text and text.endswith("hand-written\n")
