"""encode_prompts: Wan's trim-and-zero-pad of UMT5 embeddings, and prompt cleaning."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.models.umt5 import PRESETS, UMT5Encoder
from vidax.text import clean_prompt, encode_prompts, encode_prompts_with_lengths

PROMPTS = ["a red cube rolls over the floor", "the blue sphere", "slowly"]


def test_embeddings_are_trimmed_and_zero_padded(encoder, tokenizer):
    max_length = 40  # longer than the 16-token bucket the encoder actually runs at
    out, lengths = encode_prompts_with_lengths(encoder, tokenizer, PROMPTS, max_length)
    assert out.shape == (3, max_length, PRESETS["tiny"].d_model) and out.dtype == np.float32
    np.testing.assert_array_equal(lengths, [8, 4, 2])  # words + EOS
    ids, mask = tokenizer.encode(PROMPTS, max_length=max_length)
    full = np.asarray(encoder(jnp.asarray(ids), jnp.asarray(mask)))  # at the full length
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(out[row, :n], full[row, :n], rtol=1e-5, atol=1e-5)
        assert np.all(out[row, n:] == 0)
        assert np.all(np.abs(out[row, :n]).sum(-1) > 0)
    np.testing.assert_array_equal(encode_prompts(encoder, tokenizer, PROMPTS, max_length), out)


def test_single_prompt_truncation_and_empty_batch(encoder, tokenizer):
    one = encode_prompts(encoder, tokenizer, "a red cube", max_length=3)
    assert one.shape == (1, 3, PRESETS["tiny"].d_model)
    assert np.all(np.abs(one).sum(-1) > 0)  # "a red" + EOS fill all three rows
    empty = encode_prompts(encoder, tokenizer, [], max_length=5)
    assert empty.shape == (0, 5, PRESETS["tiny"].d_model)


def test_prompts_are_cleaned_like_diffusers(encoder, tokenizer):
    assert clean_prompt("  a &amp;amp; b\n\t c  ") == "a & b c"
    messy = encode_prompts(encoder, tokenizer, ["  the\tblue \n sphere "], max_length=8)
    tidy = encode_prompts(encoder, tokenizer, ["the blue sphere"], max_length=8)
    np.testing.assert_array_equal(messy, tidy)


def test_tokenizer_that_does_not_fit_the_encoder_raises(tokenizer):
    small = UMT5Encoder(dataclasses.replace(PRESETS["tiny"], vocab_size=5), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="5 embeddings"):
        encode_prompts(small, tokenizer, ["the floor"], max_length=8)
