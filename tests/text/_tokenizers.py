"""A tiny word-level tokenizer.json built in-test (no downloads)."""

import pytest

from vidax.models.umt5 import Tokenizer

WORDS = ["a", "red", "cube", "blue", "sphere", "rolls", "over", "the", "floor", "slowly"]
T5_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2 as in T5 vocabularies


def word_tokenizer_json(path, words=WORDS, *, specials=T5_SPECIALS, eos_post_processor=False):
    """Writes a whitespace/word-level tokenizer.json: specials first, then `words`."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {tok: i for i, tok in enumerate([*specials, *words])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    if eos_post_processor:  # as in Hugging Face T5 tokenizer.json files
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single="$A </s>", special_tokens=[("</s>", vocab["</s>"])]
        )
    tok.save(str(path))
    return path


def word_tokenizer(path, words=WORDS) -> Tokenizer:
    return Tokenizer(word_tokenizer_json(path, words))
