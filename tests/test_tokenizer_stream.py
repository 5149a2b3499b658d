"""StreamDecoder's pieces, joined, are the whole reply's decoded text, for the tokenizer kinds
converted models bring (byte-level BPE as GPT-2/Qwen/DeepSeek, SentencePiece-style Metaspace
BPE as Llama/Mistral, WordPiece), on text with multi-byte characters split across tokens."""

from __future__ import annotations

import random

import pytest
from moepack.runtime.tokenizer import StreamDecoder, Tokenizer
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

CORPUS = [
    "def read_config(path):\n    return json.load(open(path))  # ok",
    "Grüße aus Köln — naïve café, façade; 東京で寿司を食べた。",
    "emoji 🙂🚀👩‍💻 and math ∑ x² ≤ ∞, tabs\tand  double  spaces",
    "Привет, мир! مرحبا بالعالم שלום עולם",
] * 20


def _byte_level() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _metaspace() -> HFTokenizer:
    """Llama's kind: "▁" for spaces, ASCII characters, every other character as its UTF-8 bytes
    (<0xNN> tokens in the vocabulary, as Llama's are, not special ones)."""
    pieces = ["<unk>", "▁", *(chr(c) for c in range(33, 127)),
              *(f"<0x{b:02X}>" for b in range(256))]
    tok = HFTokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [], byte_fallback=True,
                                 unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(),
                                     decoders.Fuse()])
    return tok


def _wordpiece() -> HFTokenizer:
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=400,
                                                             special_tokens=["[UNK]"]))
    return tok


@pytest.mark.parametrize("make", [_byte_level, _metaspace, _wordpiece])
def test_the_pieces_join_to_the_decoded_reply(make) -> None:
    tok = Tokenizer(make().to_str().encode(), {})
    rng = random.Random(0)
    for text in CORPUS[:4] + [" ".join(rng.sample(CORPUS[:4], 4))]:
        ids = tok.encode(text, add_special_tokens=False)
        d = StreamDecoder(tok)
        pieces = [d.push(i) for i in ids]
        assert "".join(pieces) == tok.decode(ids), (pieces, text)
        assert not any("\ufffd" in p for p in pieces)  # no half character given out
        if make is not _wordpiece:  # (WordPiece's decode respaces punctuation)
            assert tok.decode(ids) == text
            assert "" in pieces or text.isascii()  # characters split over tokens were met
