"""Write a synthetic container for `make -C runtime bench`: realistic expert record sizes
(q8 experts, hidden 2048, inter 1024: ~6.7 MB per record), random record bytes (speed only).

    python runtime/tests_c/make_bench_container.py OUT.moepack [LAYERS] [EXPERTS]
"""

from __future__ import annotations

import os
import sys

from moepack.format import ContainerWriter, pack_record, plan_layout
from moepack.format.synthetic import encode_synthetic, mixtral_spec


def main() -> None:
    out = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    experts = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    spec = mixtral_spec(layers=layers, experts=experts, hidden=2048, inter=1024, vocab=256,
                        expert={"name": "q8", "group_size": 32})
    layout = plan_layout(spec)
    with ContainerWriter(out, layout) as w:
        for t in spec.tensors:
            w.write_tensor(t.name, encode_synthetic(t.codec, t.shape, f"bench:{t.name}"))
        for bank in layout.banks():
            for e in range(bank.count):
                parts = {p.name: os.urandom(p.length) for p in bank.parts}
                w.write_expert(bank.layer, e, pack_record(bank, parts))
        w.finalize()
    print(out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
