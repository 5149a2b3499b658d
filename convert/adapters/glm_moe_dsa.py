"""GLM-5.x (`GlmMoeDsaForCausalLM`): DeepSeek-V3.2's decoder (deepseek_v32.py) with GLM's sizes,
an interleaved-RoPE indexer, and cross-layer selection sharing: `indexer_types` says per layer
whether it runs its own indexer (`full`) or reuses the previous full layer's top-k (`shared`,
no indexer weights). Absent, the pattern comes from `index_topk_pattern` or
`index_topk_freq` / `index_skip_topk_offset`, as transformers derives it."""

from __future__ import annotations

from moepack.convert.adapters.deepseek_v32 import DeepseekV32Adapter
from moepack.convert.errors import SourceError
from moepack.format.model_desc import MAX_LAYERS


class GlmMoeDsaAdapter(DeepseekV32Adapter):
    arch = "glm_moe_dsa"
    hf_architecture = "GlmMoeDsaForCausalLM"
    indexer_rope_interleave = True

    def indexer_types(self, n: int) -> list[str]:
        types = self.text.get("indexer_types")
        if types is None:
            types = self._pattern(n)
        if not isinstance(types, list) or len(types) != n \
                or any(t not in ("full", "shared") for t in types):
            raise SourceError(f"config.json: 'indexer_types' must list {n} entries, each "
                              "'full' or 'shared'")
        return list(types)

    def _pattern(self, n: int) -> list:
        pattern = self.text.get("index_topk_pattern")
        if isinstance(pattern, str):
            letters = {"F": "full", "S": "shared"}
            if any(ch not in letters for ch in pattern):
                raise SourceError("config.json: 'index_topk_pattern' must be letters F and S")
            return [letters[ch] for ch in pattern]
        if pattern is not None:
            return pattern if isinstance(pattern, list) else [pattern]
        freq = max(self.cfg_int("index_topk_freq", default=1, hi=MAX_LAYERS), 1)
        offset = self.cfg_int("index_skip_topk_offset", default=2, hi=MAX_LAYERS)
        return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
