"""PromptCache: repeated prompts are served from disk; every key ingredient causes a miss."""

import numpy as np
import pytest
from flax import nnx
from tests.text._tokenizers import WORDS, word_tokenizer

from vidax.models.umt5 import PRESETS, UMT5Encoder
from vidax.text import PromptCache, encode_prompts, encoder_fingerprint
from vidax.text import encode as encode_module


@pytest.fixture
def calls(monkeypatch):
    """Records the prompts of every real encoder pass the cache makes."""
    seen: list[list[str]] = []
    real = encode_module.encode_prompts_with_lengths

    def counting(encoder, tokenizer, prompts, *args, **kwargs):
        seen.append(list(prompts))
        return real(encoder, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(encode_module, "encode_prompts_with_lengths", counting)
    return seen


def test_repeated_prompts_cost_no_encoder_pass(encoder, tokenizer, tmp_path, calls):
    prompts = ["a red cube", "the blue sphere rolls", "a red cube"]
    want = encode_prompts(encoder, tokenizer, prompts, max_length=12)
    calls.clear()
    cache = PromptCache(tmp_path)
    first = cache.encode(encoder, tokenizer, prompts, max_length=12)
    assert calls == [["a red cube", "the blue sphere rolls"]]  # duplicates encoded once
    assert (cache.hits, cache.misses) == (1, 2)
    np.testing.assert_allclose(first, want, rtol=1e-6, atol=1e-6)
    assert np.all(first[0, 4:] == 0)

    again = PromptCache(tmp_path).encode(encoder, tokenizer, prompts[::-1], max_length=12)
    assert len(calls) == 1  # a fresh cache object reads the same directory
    np.testing.assert_array_equal(again, first[::-1])

    mixed = cache.encode(encoder, tokenizer, ["the floor", "a red cube"], max_length=12)
    assert calls[-1] == ["the floor"]  # only the new prompt is encoded
    np.testing.assert_array_equal(mixed[1], first[0])
    assert (cache.hits, cache.misses) == (2, 3)


def test_key_covers_length_encoder_and_tokenizer(encoder, tokenizer, tmp_path, calls):
    cache = PromptCache(tmp_path)
    cache.encode(encoder, tokenizer, "a red cube", max_length=12)
    cache.encode(encoder, tokenizer, "a red cube", max_length=16)
    other = UMT5Encoder(PRESETS["tiny"], rngs=nnx.Rngs(1))
    assert encoder_fingerprint(other) != encoder_fingerprint(encoder)
    assert encoder_fingerprint(encoder) == encoder_fingerprint(encoder)
    cache.encode(other, tokenizer, "a red cube", max_length=12)
    cache.encode(encoder, tokenizer, "a red cube", max_length=12, encoder_identity="ckpt-v1")
    shuffled = word_tokenizer(tmp_path / "shuffled.json", WORDS[::-1])
    cache.encode(encoder, shuffled, "a red cube", max_length=12)
    cache.encode(encoder, tokenizer, "a red cube", max_length=12, clean=False)
    assert len(calls) == 6 and cache.misses == 6
    cache.encode(encoder, tokenizer, "a red cube", max_length=12, encoder_identity="ckpt-v1")
    assert len(calls) == 6 and cache.hits == 1


def test_corrupt_entry_is_reencoded(encoder, tokenizer, tmp_path, calls):
    cache = PromptCache(tmp_path)
    want = cache.encode(encoder, tokenizer, "the blue sphere", max_length=10)
    (entry,) = tmp_path.glob("*.npy")
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    got = cache.encode(encoder, tokenizer, "the blue sphere", max_length=10)
    assert len(calls) == 2
    np.testing.assert_array_equal(got, want)
    assert entry.read_bytes() == data  # rewritten whole
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="max_length"):
        cache.encode(encoder, tokenizer, "a", max_length=0)
