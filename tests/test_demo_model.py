"""The shipped demo model (demo/model) loads offline with transformers and learned something."""

import copy
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "demo" / "model"
HELDOUT = ROOT / "demo" / "heldout.txt"
MAX_BYTES = 30 * 1000 * 1000


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tok = transformers.AutoTokenizer.from_pretrained(MODEL, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, local_files_only=True)
    model.eval()
    return model, tok


def test_checkpoint_files_and_size():
    names = {p.name for p in MODEL.iterdir()}
    for need in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert need in names
    total = sum(p.stat().st_size for p in MODEL.iterdir() if p.is_file())
    assert total <= MAX_BYTES, total


def test_config_constraints(model_and_tokenizer):
    model, tok = model_and_tokenizer
    cfg = model.config
    assert type(model).__name__ == "MixtralForCausalLM"
    assert cfg.num_local_experts >= 8
    assert cfg.num_experts_per_tok == 2
    assert cfg.num_hidden_layers >= 4
    assert cfg.hidden_size % 32 == 0 and cfg.intermediate_size % 32 == 0
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    assert model.dtype == torch.bfloat16  # stored and loaded as bf16
    assert len(tok) == cfg.vocab_size
    assert tok.bos_token_id == cfg.bos_token_id and tok.eos_token_id == cfg.eos_token_id
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>assistant\n")


def test_heldout_loss_well_below_uniform(model_and_tokenizer):
    model, tok = model_and_tokenizer
    text = HELDOUT.read_text()
    assert 20_000 <= len(text.encode()) <= 60_000
    ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    # 8 evenly spaced 256-token windows (~2 K tokens), so no single file (the excerpt opens
    # with a license header) dominates the short sample.
    seq, k = 256, 8
    stride = ((len(ids) - 1) // seq) // k
    batch = torch.tensor([ids[i * seq : i * seq + seq + 1] for i in range(0, stride * k, stride)])
    with torch.no_grad():
        logits = copy.deepcopy(model).float()(input_ids=batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1)
    ).item()
    uniform = math.log(model.config.vocab_size)
    assert loss < 0.6 * uniform, (loss, uniform)
