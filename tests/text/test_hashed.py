"""The built-in hashed text embedder."""

import numpy as np
import pytest

from vidax.text.hashed import HashedTextEmbedder


def test_deterministic_and_word_sensitive():
    emb = HashedTextEmbedder(dim=16, text_len=6)
    a, mask = emb("A red circle, bouncing!")
    b, _ = HashedTextEmbedder(dim=16, text_len=6)(["a red circle bouncing"])
    np.testing.assert_array_equal(a, b)  # case and punctuation do not matter
    assert a.shape == (1, 6, 16) and a.dtype == np.float32
    np.testing.assert_array_equal(mask, [[True] * 4 + [False] * 2])
    assert np.all(a[0, 4:] == 0)
    c, _ = emb("a blue circle bouncing")
    assert np.abs(a[0, 1] - c[0, 1]).max() > 0.5  # the colour token differs
    np.testing.assert_array_equal(a[0, 2], c[0, 2])  # same word at the same position


def test_word_order_is_visible():
    emb = HashedTextEmbedder(dim=16, text_len=4)
    a, _ = emb("red circle blue square")
    b, _ = emb("blue circle red square")
    assert np.abs(a - b).max() > 0.5


def test_truncation_empty_prompt_and_validation():
    emb = HashedTextEmbedder(dim=8, text_len=2)
    x, mask = emb(["one two three", ""])
    assert mask.tolist() == [[True, True], [False, False]]
    assert np.all(x[1] == 0)
    with pytest.raises(ValueError, match="even"):
        HashedTextEmbedder(dim=7, text_len=2)
    with pytest.raises(ValueError, match="text_len"):
        HashedTextEmbedder(dim=8, text_len=0)
