"""A DeepSeek-V3.2-architecture (`deepseek_v32`: MLA + DeepSeek Sparse Attention) twin of the
trained demo model, and the quality matrix's method (bench/quality.py) run on it, plus how often
quantisation changes the indexer's top-k selection (issue 16).

    python -m bench.dsa_twin WORKDIR [--demo demo/model] [--windows 16] [--ctx 128] [--topk 32]

What is carried over: the demo's embedding (LM head a copy), norms, router and 8 experts (DeepSeek
routing: sigmoid top-2, the same experts as the demo's softmax, renormalised) and its attention,
rewritten as MLA without changing what it computes except for per-token scales:

- q LoRA of rank `hidden` with q_a = identity; the no-RoPE part of each head's query is the demo's
  q_proj head (scaled by sqrt(48/32) for MLA's longer head); the q_a RMSNorm's weight is the mean
  RMS of its input, measured on the tail of the text (never scored), so it rescales each token by
  about 1.
- kv latent (rank 128) = the demo's [k_proj; v_proj] rows; kv_b picks each head's GQA group out of
  it (identity blocks); the kv_a RMSNorm weight is calibrated as above. o_proj is the demo's.
- The demo was trained with full RoPE on all 32 dims; here the 32 content dims carry no position and
  a 16-dim rotated part (seeded, std 0.05) is added. So it is not a trained model (perplexity
  printed), but its attention is the demo's content attention, not a random model's flat one.
- The indexer (8 heads × 32, first 16 rotated) scores keys with the queries of heads 0-3, their
  negations, and the key of their GQA group; each head has its own weight row (seeded, random
  unit vectors). A key that no head 0-3 query scores above 0 gets a positive score from the
  negated heads, so no score is an exact 0 shared by many keys: with one weight row shared by 4
  heads, 7.3 % of layer 0's and 2.1 % of layer 3's queries had their k-th and (k+1)-th best
  scores equal (at 0) and the tie rule picked the selection (docs/LEARNED.md, DSA twin). That
  share is printed (`boundary_tied`).
  index_topk (default 32) is below every scored position's
  context (ctx/2 … ctx-1), so every scored query attends to a strict subset.

Printed: the twin's perplexity and next-token entropy, attention entropy, how much of a dense
attention's mass the selection keeps and KL(dense ‖ sparse) (does the selection matter?), the
share of queries whose top-k boundary is tied or within 1e-3 of the best score (where f16
indexer keys can move it), then the
matrix rows with two columns more: the share of selected positions that differ between the original
and the quantised model (transformers on `moepack export` of the container, hooks on the indexer)
and the share of queries whose selection changed at all.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from bench import quality
from bench.twin import demo_tensors, fill_moe, fill_norms_and_embedding, save_twin

ROOT = Path(__file__).resolve().parent.parent
NOPE, ROPE, INDEX_HEADS = 32, 16, 8
CALIBRATION_TOKENS = 1024  # the text's tail: the scored windows come from its head


def dsa_config(demo: dict, topk: int):
    from transformers import DeepseekV32Config

    h, heads = demo["hidden_size"], demo["num_attention_heads"]
    return DeepseekV32Config(
        vocab_size=demo["vocab_size"], hidden_size=h, intermediate_size=demo["intermediate_size"],
        moe_intermediate_size=demo["intermediate_size"],
        num_hidden_layers=demo["num_hidden_layers"],
        num_attention_heads=heads, num_key_value_heads=heads,
        n_routed_experts=demo["num_local_experts"], num_experts_per_tok=demo["num_experts_per_tok"],
        n_shared_experts=1, first_k_dense_replace=0, n_group=1, topk_group=1,
        routed_scaling_factor=1.0, norm_topk_prob=True,
        q_lora_rank=h, kv_lora_rank=2 * demo["num_key_value_heads"] * demo["head_dim"],
        qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=demo["head_dim"],
        index_n_heads=INDEX_HEADS, index_head_dim=demo["head_dim"], index_topk=topk,
        rms_norm_eps=demo["rms_norm_eps"], max_position_embeddings=demo["max_position_embeddings"],
        tie_word_embeddings=False, bos_token_id=demo["bos_token_id"],
        eos_token_id=demo["eos_token_id"], pad_token_id=demo["pad_token_id"])


def attention_inputs(demo_dir: Path, ids: list[int]) -> list[torch.Tensor]:
    """Per layer, the demo's attention input (input_layernorm's output) over `ids`: [T, H]."""
    from transformers import AutoModelForCausalLM

    demo = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()
    seen: list[torch.Tensor] = []
    hooks = [layer.input_layernorm.register_forward_hook(lambda m, a, o: seen.append(o[0]))
             for layer in demo.model.layers]
    with torch.no_grad():
        demo(torch.tensor([ids]), use_cache=False)
    for hk in hooks:
        hk.remove()
    return seen


def _rms(x: torch.Tensor) -> float:
    return float(x.pow(2).mean(-1).sqrt().mean())


def build(demo_dir: Path, out: Path, calibration_ids: list[int], topk: int) -> Path:
    from transformers import DeepseekV32ForCausalLM

    d = json.loads((demo_dir / "config.json").read_text())
    heads, kv_heads, hd = d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"]
    group = heads // kv_heads
    xs = attention_inputs(demo_dir, calibration_ids)
    torch.manual_seed(0)
    model = DeepseekV32ForCausalLM(dsa_config(d, topk)).to(torch.float32).eval()
    src = demo_tensors(demo_dir)
    with torch.no_grad():
        fill_norms_and_embedding(model, src)
        for i, layer in enumerate(model.model.layers):
            p, a, x = f"model.layers.{i}.self_attn.", layer.self_attn, xs[i]
            wq, wk, wv = (src[p + f"{n}.weight"] for n in ("q_proj", "k_proj", "v_proj"))
            a.q_a_proj.weight.copy_(torch.eye(d["hidden_size"]))
            a.q_a_layernorm.weight.fill_(_rms(x))
            q_b = a.q_b_proj.weight.view(heads, NOPE + ROPE, -1)
            q_b[:, :NOPE] = wq.view(heads, hd, -1) * math.sqrt((NOPE + ROPE) / hd)
            q_b[:, NOPE:].normal_(0.0, 0.05)
            latent = torch.cat([wk, wv])
            a.kv_a_proj_with_mqa.weight[:len(latent)] = latent
            a.kv_a_proj_with_mqa.weight[len(latent):].normal_(0.0, 0.05)
            a.kv_a_layernorm.weight.fill_(_rms(x @ latent.T))
            kv_b = a.kv_b_proj.weight.view(heads, NOPE + hd, len(latent)).zero_()
            eye = torch.eye(hd)
            for h in range(heads):
                g = h // group
                kv_b[h, :NOPE, g * hd:(g + 1) * hd] = eye
                kv_b[h, NOPE:, (kv_heads + g) * hd:(kv_heads + g + 1) * hd] = eye
            a.o_proj.weight.copy_(src[p + "o_proj.weight"])
            ix = a.indexer
            q_group0 = wq[:INDEX_HEADS // 2 * hd]
            ix.wq_b.weight.copy_(torch.cat([q_group0, -q_group0]))
            ix.wk.weight.copy_(wk[:hd])
            rows = torch.randn(INDEX_HEADS, d["hidden_size"])
            ix.weights_proj.weight.copy_(rows / rows.norm(dim=1, keepdim=True))
            fill_moe(layer.mlp, src, i, d["num_local_experts"])
    return save_twin(model, demo_dir, out)


# ------------------------------------------------------------------------------------ measures
def _load(model_dir: Path, dtype: torch.dtype = torch.float32, eager: bool = False):
    from transformers import AutoModelForCausalLM

    kw = {"attn_implementation": "eager"} if eager else {}
    if dtype == torch.float64:  # torch's grouped_mm has no float64
        kw["experts_implementation"] = "eager"
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kw).eval()


def index_scores(ix, hidden_states: torch.Tensor, q_resid: torch.Tensor, position_embeddings,
                 mask: torch.Tensor) -> torch.Tensor:
    """transformers' DeepseekV32Indexer.forward up to its top-k: the scores [B, S, T], -inf
    where masked (its indices come with no scores, and ties need them)."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    b, s, _ = hidden_states.shape
    split = [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim]
    q_rot, q_pass = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim).split(split, -1)
    k_rot, k_pass = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2).split(split, -1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, *position_embeddings, unsqueeze_dim=2)
    q, k = torch.cat([q_rot, q_pass], -1), torch.cat([k_rot, k_pass], -1).squeeze(2)
    scores = torch.relu(q.float() @ k.transpose(-1, -2).float().unsqueeze(1) * ix.softmax_scale)
    w = ix.weights_proj(hidden_states).float() * ix.n_heads ** -0.5
    out = (w.unsqueeze(-2) @ scores).squeeze(-2)
    return out.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else out + mask


def run_twin(model_dir: Path, win: quality.Windows, dtype: torch.dtype = torch.float32,
             topk: int | None = None, batch: int = 4, experts_of: Path | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The checkpoint in transformers: (int16 [layers, windows, scored positions, topk] each
    scored query's selected key positions, sorted, from hooks on the indexers; float32 logits
    [windows, scored positions, vocab]; float32 [layers, windows, scored positions] the gap
    between the topk-th and the next best score over the best score's magnitude, 0 where the
    boundary is tied). topk: every indexer's index_topk replaced. experts_of: a container whose
    stored codes compute the routed experts (the engine's products, CODECS.md §3.5), not the
    checkpoint's weights."""
    model = _load(model_dir, dtype)
    if experts_of is not None:
        sys.path.insert(0, str(ROOT / "tests"))  # the engine's expert numerics, as the tests use
        from spec_experts import use_spec_expert_numerics

        use_spec_expert_numerics(model, experts_of)
    layers = model.model.layers
    seen: list[list[np.ndarray]] = [[] for _ in layers]
    gaps: list[list[np.ndarray]] = [[] for _ in layers]

    def hook(i: int):
        def keep(m, args, _kw, out: torch.Tensor) -> None:
            scored = slice(win.first, win.ctx - 1)
            sel = out[:, scored].long().sort(-1).values
            seen[i].append(sel.numpy().astype(np.int16))
            best = index_scores(m, *args[:4])[:, scored].sort(-1, descending=True).values
            k = m.index_topk
            if k < win.first + 1:  # fewer than every scored query's keys (else dense: no gap)
                gap = (best[..., k - 1] - best[..., k]) / best[..., 0].abs().clamp_min(1e-30)
            else:
                gap = torch.full(best.shape[:2], math.inf)
            gaps[i].append(gap.float().numpy())
        return keep

    hooks = []
    for i, lay in enumerate(layers):
        if topk is not None:
            lay.self_attn.indexer.index_topk = topk
        hooks.append(lay.self_attn.indexer.register_forward_hook(hook(i), with_kwargs=True))
    logits = []
    with torch.no_grad():
        for i in range(0, len(win.tokens), batch):
            lg = model(torch.from_numpy(win.tokens[i:i + batch]), use_cache=False).logits
            logits.append(lg[:, win.first:win.ctx - 1].float().numpy())
    for hk in hooks:
        hk.remove()
    return (np.stack([np.concatenate(s) for s in seen]), np.concatenate(logits),
            np.stack([np.concatenate(g) for g in gaps]))


def selection_change(ref: np.ndarray, q: np.ndarray) -> dict:
    """Share of selected positions that differ (of topk per query) and of queries whose
    selection differs at all, overall and per layer."""
    k = ref.shape[-1]
    kept = (ref[..., :, None] == q[..., None, :]).any(-1).sum(-1)  # [L, W, P]
    replaced = (k - kept) / k
    return {"sel_replaced": float(replaced.mean()),
            "sel_queries_changed": float((replaced > 0).mean()),
            "sel_replaced_by_layer": [round(float(r.mean()), 5) for r in replaced]}


def attention_entropy(model_dir: Path, win: quality.Windows, batch: int = 4) -> float:
    """Mean entropy (nats) of the attention distributions of every layer and head at the scored
    positions (the sparse model: spread over its topk selected keys at most)."""
    model, total, n = _load(model_dir, eager=True), 0.0, 0
    with torch.no_grad():
        for i in range(0, len(win.tokens), batch):
            out = model(torch.from_numpy(win.tokens[i:i + batch]), use_cache=False,
                        output_attentions=True)
            for att in out.attentions:  # [B, heads, S, T]
                a = att[:, :, win.first:win.ctx - 1].double()
                ent = -(a * torch.log(a.clamp_min(1e-300))).sum(-1)
                total, n = total + float(ent.sum()), n + ent.numel()
    return total / n


def twin_profile(demo_dir: Path, twin: Path, win: quality.Windows, topk: int) -> dict:
    """Why the twin is not trivial: its perplexity and next-token entropy next to the demo's,
    its attention entropy next to uniform over topk keys, what the selection changes (KL of the
    dense twin to the sparse one), how sensitive the selection is to rounding alone
    (transformers in float64 against float32 on the same weights), and how often the top-k
    boundary is tied or nearly so."""
    sel, sparse, gap = run_twin(twin, win)
    sel64, sparse64, _ = run_twin(twin, win, torch.float64)
    demo = quality.reference_logits(demo_dir, win)
    vs_dense = quality.statistics(run_twin(twin, win, topk=win.ctx)[1], sparse, win)
    vs_f64 = quality.statistics(sparse64, sparse, win)

    def entropy(lg: np.ndarray) -> float:
        p = torch.log_softmax(torch.from_numpy(lg).double(), -1)
        return float(-(p.exp() * p).sum(-1).mean())

    ctx_sizes = np.arange(win.first, win.ctx - 1) + 1
    return {"ppl_twin": quality.statistics(sparse, sparse, win)["ppl_ref"],
            "ppl_demo": quality.statistics(demo, demo, win)["ppl_ref"],
            "token_entropy_twin": entropy(sparse), "token_entropy_demo": entropy(demo),
            "uniform_token_entropy": math.log(sparse.shape[-1]),
            "attention_entropy": attention_entropy(twin, win),
            "uniform_attention_entropy": math.log(topk),
            "selected_share": float(np.mean(topk / ctx_sizes)),
            "kl_dense_sparse": vs_dense["kl_mean"], "top1_dense_sparse": vs_dense["top1"],
            "kl_f64_f32": vs_f64["kl_mean"], "top1_f64_f32": vs_f64["top1"],
            "boundary_tied": float((gap == 0).mean()),
            "boundary_tied_by_layer": [round(float((g == 0).mean()), 5) for g in gap],
            "boundary_within_1e-3": float((gap < 1e-3).mean()),
            **{f"{k}_f64_f32": v for k, v in selection_change(sel64, sel).items()}}


# ------------------------------------------------------------------------------------ run
# the GLM twin's rows: presets either side of the default, the experts' error alone, attention
ROWS = ("(default)", "rvq4", "rvq2", "trunk f32", "attn q8", "attn q4")


def selection_rows(twin: Path, work: Path, win: quality.Windows):
    """row_extra for quality.matrix: the container's selections against the original's; for
    the default container also the sanity comparison with f32 KV entries (f32 indexer keys),
    next to the matrix's with the engine's default f16, then with transformers computing the
    routed experts as the engine does (§3.5 table products, not the exported weights), and how
    often those products alone change transformers' selection."""
    from moepack.convert.export import export

    ref = run_twin(twin, win)[0]
    default = f"{quality._slug(quality.DEFAULT_ROW)}.moepack"

    def extra(container: Path, _win: quality.Windows) -> dict:
        hf = work / "export-selection"
        shutil.rmtree(hf, ignore_errors=True)
        export(container, hf)
        try:
            sel, logits, _ = run_twin(hf, win)
            out = selection_change(ref, sel)
            if container.name == default:
                f32 = quality.container_logits(container, win, kv="f32")
                out["sanity_f32_kv"] = quality.statistics(logits, f32, win)
                # numpy products: one batch keeps it to one call per expert and part
                spec_sel, spec, _ = run_twin(hf, win, batch=len(win.tokens), experts_of=container)
                out["sanity_f32_kv_spec_experts"] = quality.statistics(spec, f32, win)
                out["sanity_spec_experts_selection"] = selection_change(sel, spec_sel)
            return out
        finally:
            shutil.rmtree(hf, ignore_errors=True)
    return extra


def _table_row(name: str, r: dict) -> str:
    sel = ("—", "—") if "sel_replaced" not in r else \
        (f"{100 * r['sel_replaced']:.2f} %", f"{100 * r['sel_queries_changed']:.1f} %")
    return (f"| {name} | {r['bpw_experts']:.2f} | {quality.fmt_kl(r['kl_mean'])} ± "
            f"{quality.fmt_kl(r['kl_mean_se'])} | {quality.fmt_kl(r['kl_median'])} "
            f"| {quality.fmt_kl(r['kl_p99'])} | {100 * r['top1']:.2f} | {r['ppl_ratio']:.4f} "
            f"| {sel[0]} | {sel[1]} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dsa_twin",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--demo", type=Path, default=ROOT / "demo" / "model")
    ap.add_argument("--text", type=Path, default=ROOT / "demo" / "heldout.txt")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--topk", type=int, default=32, help="index_topk (below ctx/2: sparse)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", nargs="*", default=list(ROWS), help="matrix rows (substrings)")
    ap.add_argument("--redo", action="store_true")
    args = ap.parse_args(argv)
    if not 0 < args.topk < args.ctx // 2:
        ap.error(f"--topk must be in 1..{args.ctx // 2 - 1}: the selection must be a strict "
                 "subset of every scored position's context")
    work, twin = args.workdir, args.workdir / "twin"
    ids = quality.tokenize(args.demo, args.text.read_text(encoding="utf-8"))
    win = quality.make_windows(ids, quality.bos_id(args.demo), args.ctx, None, args.windows)
    if len(ids) - CALIBRATION_TOKENS < len(win.tokens) * (args.ctx - 1):
        ap.error(f"{args.text}: too short for {args.windows} windows and "
                 f"{CALIBRATION_TOKENS} calibration tokens")
    if args.redo or not (twin / "config.json").exists():
        build(args.demo, twin, [quality.bos_id(args.demo)] + ids[-CALIBRATION_TOKENS:], args.topk)
    profile = twin_profile(args.demo, twin, win, args.topk)
    print(json.dumps(profile, indent=1), flush=True)
    margs = argparse.Namespace(workdir=work, redo=args.redo, reference=twin, text=args.text,
                               ctx=args.ctx, first=None, windows=args.windows,
                               threads=args.threads, only=args.only, llama=False)
    data = quality.matrix(margs, row_extra=selection_rows(twin, work, win))
    data["twin_profile"] = profile
    (work / "results.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    print("| setting | experts bpw | mean KL ± se | median KL | p99 KL | top-1 % | PPL ratio "
          "| selected keys replaced | queries with a changed selection |")
    for name, r in quality.ordered(data["rows"]):
        print(_table_row(name, r))
        for key, what in (("sanity_f32_kv", "f32 KV"),
                          ("sanity_f32_kv_spec_experts", "f32 KV, transformers with the "
                           "engine's expert products")):
            if key in r:
                print(_table_row(f"{quality.SANITY}, {what}",
                                 {"bpw_experts": r["bpw_experts"], **r[key]}))
        if "sanity_spec_experts_selection" in r:
            print("expert products alone, selection:", r["sanity_spec_experts_selection"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
