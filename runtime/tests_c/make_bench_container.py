"""Write a synthetic container for `make -C runtime bench`: realistic expert record sizes
(q8 experts, hidden 2048, inter 1024: ~6.7 MB per record), random record bytes (speed only).

    python runtime/tests_c/make_bench_container.py OUT.moepack [LAYERS] [EXPERTS]
"""

from __future__ import annotations

import os
import sys

from moepack.format.synthetic import mixtral_spec, write_synthetic


def main() -> None:
    out = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    experts = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    spec = mixtral_spec(layers=layers, experts=experts, hidden=2048, inter=1024, vocab=256,
                        expert={"name": "q8", "group_size": 32})
    write_synthetic(out, spec, seed="bench", random_experts=True)
    print(out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
