"""What the int8 lookup tables cost: `python -m bench.table_error CONTAINER [--source demo/model]`.

For every routed (token, expert) pair of held-out text, compares the CODECS.md §3.5 product
(moepack.format.rvq_matvec, what an engine computes) with the exact product of the decoded
weights Ŵx (f64), per projection; `down` gets the exact silu(Ŵ_gate x) ⊙ Ŵ_up x. Prints the
relative error ‖y − Ŵx‖ / ‖Ŵx‖ on those activations and on Gaussian ones, and the codec's own
error ‖Ŵx − Wx‖ / ‖Ŵx‖ for scale. The container must be a conversion of --source.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from moepack.format.reader import Container
from moepack.format.rvq_matvec import rvq_matvec

PARTS = ("gate", "up", "down")


def expert_inputs(model: torch.nn.Module, ids: list[int]) -> dict[int, tuple]:
    """Layer -> (experts module, its hidden_states [T, H], top_k_index [T, k]) for `ids`."""
    seen: dict[int, tuple] = {}
    for i, layer in enumerate(model.model.layers):
        for m in layer.modules():
            if type(m).__name__.endswith("Experts"):
                def record(h, idx, w, i=i, m=m, orig=m.forward):
                    seen[i] = (m, h.detach().numpy().copy(), idx.numpy().copy())
                    return orig(h, idx, w)
                m.forward = record
    with torch.no_grad():
        model(torch.tensor([ids]))
    return seen


def weights(m: torch.nn.Module, e: int) -> dict[str, np.ndarray]:
    inter = m.intermediate_dim
    return {"gate": m.gate_up_proj[e, :inter].detach().numpy(),
            "up": m.gate_up_proj[e, inter:].detach().numpy(),
            "down": m.down_proj[e].detach().numpy()}


def measure(c: Container, seen: dict[int, tuple],
            rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per projection: Σ‖y − Ŵx‖², Σ‖Ŵx‖², Σ‖Ŵx − Wx‖², and the same two sums for Gaussian x."""
    acc = {p: np.zeros(5) for p in PARTS}
    for layer, (m, h, idx) in seen.items():
        parts = {p["name"]: p for p in c.bank(layer)["parts"]}
        cbs = {p: c.tensor(f"layers.{layer}.experts.{p}.codebook") for p in PARTS}
        for e in range(c.bank(layer)["count"]):
            x = h[(idx == e).any(axis=1)].astype(np.float32)
            if not len(x):
                continue
            w = weights(m, e)
            w_hat = {p: c.expert_part(layer, e, p).astype(np.float64) for p in PARTS}
            g = x @ w_hat["gate"].T
            inputs = {"gate": x, "up": x,
                      "down": (g / (1 + np.exp(-g)) * (x @ w_hat["up"].T)).astype(np.float32)}
            for p in PARTS:
                data, shape = c.expert_part_bytes(layer, e, p), parts[p]["shape"]
                xs, gauss = inputs[p], rng.standard_normal((16, shape[1])).astype(np.float32)
                exact, exact_g = xs @ w_hat[p].T, gauss @ w_hat[p].T
                y = rvq_matvec(parts[p]["codec"], shape, data, cbs[p], xs)
                y_g = rvq_matvec(parts[p]["codec"], shape, data, cbs[p], gauss)
                acc[p] += [np.sum((y - exact) ** 2), np.sum(exact**2),
                           np.sum((exact - xs @ w[p].T.astype(np.float64)) ** 2),
                           np.sum((y_g - exact_g) ** 2), np.sum(exact_g**2)]
    return acc


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("container", type=Path)
    ap.add_argument("--source", type=Path, default=Path("demo/model"))
    ap.add_argument("--text", type=Path, default=Path("demo/heldout.txt"))
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    ids = AutoTokenizer.from_pretrained(a.source)(a.text.read_text())["input_ids"][: a.tokens]
    model = AutoModelForCausalLM.from_pretrained(a.source, dtype=torch.float32).eval()
    with Container.open(a.container) as c:
        acc = measure(c, expert_inputs(model, ids), np.random.default_rng(0))
    print(f"{len(ids)} tokens of {a.text}")
    for p, (err, ref, codec, err_g, ref_g) in acc.items():
        pct = [100 * np.sqrt(a / b) for a, b in ((err, ref), (err_g, ref_g), (codec, ref))]
        print(f"{p}: table error {pct[0]:.2f} % (Gaussian x {pct[1]:.2f} %), "
              f"codec error {pct[2]:.2f} %")


if __name__ == "__main__":
    main()
