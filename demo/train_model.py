"""Train moepack's embedded demo model: a small Mixtral-architecture MoE, on CPU, from scratch.

What it does, end to end, fully offline:

1. Collects the training text from the running interpreter's own standard library: every ``.py``
   file under ``sysconfig.get_paths()["stdlib"]`` (sorted walk; test suites, idlelib, tkinter,
   lib2to3, turtledemo, ensurepip, site-packages and caches skipped). ``pydoc_data/topics.py``
   carries the Python reference docs as text, so docs are included too. Whole files whose
   SHA-256 of their relative path falls in 1/20 of the hash space are held out for evaluation.
2. Trains a byte-level BPE tokenizer (``tokenizers``) on the training files only.
3. Trains ``MixtralForCausalLM`` (8 experts, top-2, 4 layers, GQA, tied embeddings, router
   load-balancing aux loss on) with AdamW, linear warmup + cosine decay, sequence length 256,
   seeded and deterministic data order; logs the loss curve (and periodic held-out loss) as CSV.
4. Saves the checkpoint in bf16 (``model.safetensors`` + config + tokenizer files with a
   ChatML ``chat_template``), loads it back with ``AutoModelForCausalLM.from_pretrained`` and
   measures held-out loss/perplexity, then prints greedy and sampled generations.

Time: the shipped model was trained with a 27-minute wall-clock budget (``--schedule ''
--steps 2000 --minutes 27``, 1 torch thread, on a 2-core Intel Xeon shared with other jobs):
the cosine follows progress = max(step/steps, elapsed/budget) and training stops when it reaches
1, so the LR always anneals; that run did 611 steps (1.25 M tokens) in 1623 s, plus ~1 min of
tokenizer training and ~1-2 min of evaluation. Its per-step LR is in demo/loss_curve.csv, and
the defaults replay it (``--schedule demo/loss_curve.csv``: same 611 steps, same LRs to 10
significant digits, same seeded data order), so ``python demo/train_model.py`` reproduces
demo/model in however long 611 steps take on your machine (estimate: ~13 min on an idle 2-core
box at the ~1.25 CPU-s/step measured here; 27 min on the shared one). docs/DEMO_MODEL.md has
the measured numbers. The data depends on the Python version (3.11.7 for the shipped model).

Usage::

    python demo/train_model.py                      # reproduce demo/model, demo/loss_curve.csv
    python demo/train_model.py --out /tmp/m --curve /tmp/c.csv --heldout-txt '' \\
        --schedule '' --steps 20                     # one-minute smoke run
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "tkinter",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "dist-packages",
    "__pycache__",
}
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HELDOUT_MOD = 20  # 1 file in ~20 is held out


# ----------------------------------------------------------------------------------------- data
def collect_files(stdlib: Path) -> list[tuple[str, str]]:
    """(relative path, text) of every stdlib .py file, in a deterministic sorted order."""
    out = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(root) / name
            rel = path.relative_to(stdlib).as_posix()
            text = path.read_bytes().decode("utf-8", errors="replace")
            if text.strip():
                out.append((rel, text))
    out.sort(key=lambda x: x[0])
    return out


def is_heldout(rel: str) -> bool:
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:4], "big") % HELDOUT_MOD == 0


def heldout_excerpt(files: list[tuple[str, str]], target: int = 40_000, limit: int = 60_000) -> str:
    """Deterministic excerpt of held-out text: whole files in sorted order, skipping files
    larger than ``limit``, until ``target`` bytes are reached."""
    parts, n = [], 0
    for _, text in files:
        b = len(text.encode())
        if b > limit - n:
            continue
        parts.append(text.rstrip("\n") + "\n")
        n += b
        if n >= target:
            break
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------------ tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=max_len,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # Compact JSON: the same tokenizer in 0.23 MB instead of 0.55 MB pretty-printed; it travels
    # inside every container as a blob
    fast.backend_tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    # Keep the chat template inside tokenizer_config.json too (transformers 5 may write it to a
    # separate chat_template.jinja); both places load the same template.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["bos_token"], cfg["eos_token"], cfg["pad_token"] = "<s>", "</s>", "<pad>"
    # Portable class name and special-token key (transformers 4.x reads these; 5.x too).
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", ["<|im_start|>", "<|im_end|>"])
    cfg["additional_special_tokens"] = extra
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    jinja = out / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()


def encode_docs(tok, texts: list[str], bos: int, eos: int) -> torch.Tensor:
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def blocks(stream: torch.Tensor, seq: int) -> torch.Tensor:
    """Non-overlapping (seq+1)-token windows with a 1-token overlap between neighbours."""
    n = (len(stream) - 1) // seq
    idx = torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :]
    return stream[idx]


# ---------------------------------------------------------------------------------------- model
def build_config(vocab_size: int, seq: int, bos: int, eos: int, pad: int):
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=8,
        num_experts_per_tok=2,
        hidden_act="silu",
        max_position_embeddings=4 * seq,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        router_aux_loss_coef=0.02,
        output_router_logits=False,
        router_jitter_noise=0.0,
        attention_dropout=0.0,
        initializer_range=0.02,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
    )


def count_params(model) -> dict:
    seen, total, expert = set(), 0, 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel()
        if ".experts." in name:
            expert += p.numel()
    cfg = model.config
    active = total - expert + expert * cfg.num_experts_per_tok // cfg.num_local_experts
    emb = model.get_input_embeddings().weight.numel()
    return {
        "total": total,
        "expert": expert,
        "active_per_token": active,
        "embedding": emb,
        "active_non_embedding": active - emb,
    }


@torch.no_grad()
def eval_loss(model, data: torch.Tensor, batch: int = 16) -> float:
    was = model.training
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(data), batch):
        b = data[i : i + batch]
        logits = model(input_ids=b[:, :-1]).logits.float()
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), b[:, 1:].reshape(-1), reduction="sum"
        )
        tot += loss.item()
        n += b[:, 1:].numel()
    model.train(was)
    return tot / n


def lr_at(step: int, warmup: int, progress: float, p_warm: float, peak: float, floor: float):
    """Linear warmup over ``warmup`` steps, then cosine from ``peak`` to ``floor`` as the run's
    progress (0..1) goes from ``p_warm`` (its value when warmup ended) to 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (progress - p_warm) / max(1e-9, 1.0 - p_warm)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * min(1.0, max(0.0, t))))


def read_schedule(path: str) -> list[float]:
    with open(path, newline="") as f:
        return [float(r["lr"]) for r in csv.DictReader(f)]


# ----------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    root = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(root / "model"))
    ap.add_argument("--curve", default=str(root / "loss_curve.csv"))
    ap.add_argument(
        "--heldout-txt",
        default=str(root / "heldout.txt"),
        help="where to write the held-out excerpt ('' to skip)",
    )
    ap.add_argument("--steps", type=int, default=900, help="planned steps (ignored by --schedule)")
    ap.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="wall-clock training budget (0 = none): progress = max(step/steps, elapsed/budget) "
        "drives the cosine, and training stops when it reaches 1, so the LR always anneals",
    )
    default_sched = root / "loss_curve.csv"
    ap.add_argument(
        "--schedule",
        default=str(default_sched) if default_sched.exists() else "",
        help="replay the per-step LR (and so the step count) from a loss-curve CSV; the default "
        "replays the shipped run's demo/loss_curve.csv ('' = use --steps/--minutes)",
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-blocks", type=int, default=16)
    ap.add_argument(
        "--final-eval-blocks",
        type=int,
        default=160,
        help="held-out blocks (evenly spaced) for the final perplexity (0 = all)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; 1 is 3-4x faster than 2 on a shared, oversubscribed 2-core box",
    )
    args = ap.parse_args(argv)

    t_start = time.time()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = collect_files(stdlib)
    train_files = [(r, t) for r, t in files if not is_heldout(r)]
    held_files = [(r, t) for r, t in files if is_heldout(r)]
    print(
        f"python {sys.version.split()[0]} stdlib {stdlib}: {len(files)} files, "
        f"{len(train_files)} train ({sum(len(t.encode()) for _, t in train_files)} B), "
        f"{len(held_files)} held out ({sum(len(t.encode()) for _, t in held_files)} B)",
        flush=True,
    )
    print("held-out files:", " ".join(r for r, _ in held_files), flush=True)
    if args.heldout_txt:
        excerpt = heldout_excerpt(held_files)
        Path(args.heldout_txt).write_text(excerpt)
        print(f"wrote {args.heldout_txt} ({len(excerpt.encode())} B)", flush=True)

    t0 = time.time()
    tok = train_tokenizer([t for _, t in train_files], args.vocab)
    save_tokenizer(tok, out, 4 * args.seq)
    bos, eos, pad = (tok.token_to_id(s) for s in ("<s>", "</s>", "<pad>"))
    train_stream = encode_docs(tok, [t for _, t in train_files], bos, eos)
    held_stream = encode_docs(tok, [t for _, t in held_files], bos, eos)
    train_blocks = blocks(train_stream, args.seq)
    held_blocks = blocks(held_stream, args.seq)
    print(
        f"tokenizer: vocab {tok.get_vocab_size()} trained+encoded in {time.time() - t0:.1f}s; "
        f"train tokens {len(train_stream)} ({len(train_blocks)} blocks), held-out tokens "
        f"{len(held_stream)} ({len(held_blocks)} blocks), "
        f"{sum(len(t.encode()) for _, t in train_files) / len(train_stream):.2f} B/token",
        flush=True,
    )
    g = torch.Generator().manual_seed(args.seed)
    eval_idx = torch.randperm(len(held_blocks), generator=g)[: args.eval_blocks].sort().values
    eval_blocks = held_blocks[eval_idx]

    from transformers import GenerationConfig, MixtralForCausalLM

    config = build_config(tok.get_vocab_size(), args.seq, bos, eos, pad)
    torch.manual_seed(args.seed)
    model = MixtralForCausalLM(config)
    model.float().train()
    pc = count_params(model)
    print("params:", json.dumps(pc), flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    schedule = read_schedule(args.schedule) if args.schedule else None
    n_steps = len(schedule) if schedule else args.steps
    budget = args.minutes * 60 if (args.minutes > 0 and not schedule) else 0.0
    print(
        f"schedule: {'replay ' + args.schedule if schedule else 'cosine'}, {n_steps} steps"
        + (f", wall-clock budget {args.minutes} min" if budget else ""),
        flush=True,
    )
    p_warm = 0.0
    order: list[int] = []
    epoch = 0
    rows = []
    t_train = time.time()
    step = 0
    for step in range(n_steps):
        if len(order) < args.batch:
            order += torch.randperm(len(train_blocks), generator=g).tolist()
            epoch += 1
        idx, order = order[: args.batch], order[args.batch :]
        b = train_blocks[idx]
        elapsed = time.time() - t_train
        progress = max(step / n_steps, elapsed / budget if budget else 0.0)
        if step == args.warmup:
            p_warm = progress
        if schedule:
            lr = schedule[step]
        else:
            lr = lr_at(step, args.warmup, progress, p_warm, args.lr, args.lr * 0.1)
        for group in opt.param_groups:
            group["lr"] = lr
        out_ = model(input_ids=b[:, :-1], output_router_logits=True)
        logits = out_.logits
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), b[:, 1:].reshape(-1))
        aux = out_.aux_loss
        loss = ce + config.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        row = {
            "step": step + 1,
            "epoch": epoch,
            "lr": f"{lr:.10g}",
            "train_loss": f"{ce.item():.4f}",
            "aux_loss": f"{aux.item():.4f}",
            "grad_norm": f"{gn.item():.3f}",
            "heldout_loss": "",
            "elapsed_s": f"{time.time() - t_train:.1f}",
        }
        last = step + 1 == n_steps
        over = bool(budget) and not last and time.time() - t_train >= budget
        if (step + 1) % args.eval_every == 0 or last or over or step == 0:
            row["heldout_loss"] = f"{eval_loss(model, eval_blocks):.4f}"
        rows.append(row)
        if (step + 1) % 10 == 0 or row["heldout_loss"] or step < 3:
            print(" ".join(f"{k}={v}" for k, v in row.items() if v != ""), flush=True)
        if over:
            print(f"wall-clock budget of {args.minutes} min used up at step {step + 1}", flush=True)
            break
    train_s = time.time() - t_train
    print(
        f"training: {len(rows)} steps, {len(rows) * args.batch * args.seq} tokens, {train_s:.1f}s",
        flush=True,
    )

    with open(args.curve, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    # ---- save bf16 checkpoint
    model.config.output_router_logits = False
    model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # Also write the flat rope_theta key so transformers 4.x (whose Mixtral default is 1e6)
    # reads the same RoPE base; 5.x reads rope_parameters.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["rope_theta"] = cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    GenerationConfig(
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        do_sample=True,
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        max_new_tokens=128,
    ).save_pretrained(out)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(
        f"saved {out}: {size} bytes: "
        + ", ".join(f"{p.name}={p.stat().st_size}" for p in sorted(out.iterdir())),
        flush=True,
    )

    # ---- reload and evaluate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).float().eval()
    t2 = AutoTokenizer.from_pretrained(out)
    t0 = time.time()
    k = 1 if not args.final_eval_blocks else max(1, -(-len(held_blocks) // args.final_eval_blocks))
    final_blocks = held_blocks[::k]
    held_loss = eval_loss(m2, final_blocks)
    print(
        f"held-out (every {k}th of {len(held_blocks)} blocks: {len(final_blocks)} blocks, "
        f"{final_blocks[:, 1:].numel()} predicted "
        f"tokens, bf16 weights reloaded): loss {held_loss:.4f} ppl {math.exp(held_loss):.2f} "
        f"[{time.time() - t0:.1f}s]",
        flush=True,
    )
    if args.heldout_txt:
        ids = torch.tensor(
            [[bos] + t2(Path(args.heldout_txt).read_text(), add_special_tokens=False)["input_ids"]]
        )
        hb = blocks(ids[0], args.seq)
        hl = eval_loss(m2, hb)
        print(
            f"held-out excerpt {args.heldout_txt}: {hb[:, 1:].numel()} tokens, loss {hl:.4f} "
            f"ppl {math.exp(hl):.2f}",
            flush=True,
        )
    print(f"uniform baseline ln(vocab) = {math.log(config.vocab_size):.4f}", flush=True)
    last_train = sum(float(r["train_loss"]) for r in rows[-20:]) / len(rows[-20:])
    print(f"final train loss (mean of last {len(rows[-20:])} steps) {last_train:.4f}", flush=True)

    prompts = ["import os\n\n\ndef ", "class Parser:\n    def __init__(self", '"""']
    torch.manual_seed(args.seed)
    for p in prompts:
        enc = t2(p, return_tensors="pt", add_special_tokens=False)
        inp = torch.cat([torch.tensor([[bos]]), enc["input_ids"]], 1)
        gr = m2.generate(
            inp, attention_mask=torch.ones_like(inp), max_new_tokens=60, do_sample=False
        )
        sa = m2.generate(
            inp,
            attention_mask=torch.ones_like(inp),
            max_new_tokens=60,
            do_sample=True,
            temperature=0.8,
            top_k=40,
            top_p=0.95,
        )
        print(
            f"==== prompt {p!r} greedy:\n{t2.decode(gr[0, 1:], skip_special_tokens=True)}",
            flush=True,
        )
        print(
            f"==== prompt {p!r} sampled (T=0.8, top_k=40, top_p=0.95, seed {args.seed}):\n"
            f"{t2.decode(sa[0, 1:], skip_special_tokens=True)}",
            flush=True,
        )
    print(f"total wall-clock {time.time() - t_start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
