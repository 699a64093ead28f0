"""The trained text encoder over hashed word vectors (`vidax.models.word_encoder`)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.models.registry import get
from vidax.models.word_encoder import WordEncoder, WordEncoderConfig, load, save
from vidax.text import embed_prompts
from vidax.text.hashed import HashedTextEmbedder

CONFIG = WordEncoderConfig(in_dim=16, dim=32, num_layers=2, num_heads=2, ffn_dim=64, text_len=8)


@pytest.fixture(scope="module")
def encoder():
    return WordEncoder(CONFIG, rngs=nnx.Rngs(0))


def _words(prompts, config=CONFIG):
    words, mask = HashedTextEmbedder(dim=config.in_dim, text_len=config.text_len)(prompts)
    return jnp.asarray(words), jnp.asarray(mask)


def test_output_is_zero_on_padding_and_for_the_empty_prompt(encoder):
    words, mask = _words(["a red circle standing still", ""])
    out = np.asarray(encoder(words, mask))
    assert out.shape == (2, 8, 32)
    assert np.all(out[0, 5:] == 0) and np.all(np.abs(out[0, :5]).sum(-1) > 0)
    assert np.all(out[1] == 0)


def test_padding_content_does_not_leak_into_real_tokens(encoder):
    words, mask = _words(["a blue square"])
    noisy = words.at[:, 3:].set(jnp.ones_like(words[:, 3:]) * 5.0)
    np.testing.assert_allclose(encoder(words, mask), encoder(noisy, mask), atol=1e-6)


def test_tokens_see_their_context(encoder):
    # Bidirectional attention: 'circle' is embedded differently after 'red' than after 'blue'.
    red, red_mask = _words(["a red circle"])
    blue, blue_mask = _words(["a blue circle"])
    diff = np.abs(np.asarray(encoder(red, red_mask) - encoder(blue, blue_mask)))[0, 2]
    assert diff.max() > 1e-3


def test_save_load_round_trip(encoder, tmp_path):
    words, mask = _words(["a green triangle bouncing fast to the left"])
    save(encoder, tmp_path / "te.safetensors")
    loaded = load(tmp_path / "te.safetensors", CONFIG)
    np.testing.assert_array_equal(encoder(words, mask), loaded(words, mask))
    # bf16 storage (as the recipe ships it) loads into the float32 model.
    save(encoder, tmp_path / "bf16.safetensors", dtype=jnp.bfloat16)
    half = load(tmp_path / "bf16.safetensors", CONFIG)
    np.testing.assert_allclose(encoder(words, mask), half(words, mask), atol=0.1)


def test_bad_inputs_and_configs_are_one_line_errors(encoder):
    words, mask = _words(["a red circle"])
    with pytest.raises(ValueError, match="expected words"):
        encoder(words[..., :4], mask)
    with pytest.raises(ValueError, match="divisible"):
        WordEncoderConfig(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="dtype"):
        WordEncoderConfig(dtype="int8")


def test_pipeline_runs_the_encoder_of_a_preset_with_text_config(encoder):
    spec = dataclasses.replace(
        get("tiny"),
        text_config=CONFIG,
        config=dataclasses.replace(get("tiny").config, text_dim=32, text_len=8),
    )
    embeds = embed_prompts(spec, ["a red circle", ""], text_encoder=encoder)
    words, mask = _words(["a red circle", ""])
    np.testing.assert_allclose(embeds.embeds, encoder(words, mask), atol=1e-6)
    np.testing.assert_array_equal(embeds.mask, mask)


def test_prompt_embedder_is_the_presets_text_path():
    """Training loops embed captions as generation does: tiny's trained encoder, tiny-v1's
    hashed words; encoders that need files are refused in one line."""
    from vidax.text import PromptEmbedder

    captions = ["a red circle bouncing slowly to the right", "a blue square standing still"]
    embeds, mask = PromptEmbedder(get("tiny"))(captions)
    text = embed_prompts(get("tiny"), captions)
    np.testing.assert_array_equal(mask, np.asarray(text.mask))
    np.testing.assert_allclose(embeds, np.asarray(text.embeds) * mask[..., None], atol=1e-6)
    assert embeds.shape == (2, 32, 256) and not np.any(embeds[~mask])
    v1 = get("tiny-v1").config
    hashed = HashedTextEmbedder(dim=v1.text_dim, text_len=v1.text_len)(captions)
    for x, y in zip(PromptEmbedder(get("tiny-v1"))(captions), hashed, strict=True):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="uses 'umt5-xxl'"):
        PromptEmbedder(get("wan2.1-1.3b"))


def test_shapes_models_read_prompts_into_their_caption_grammar():
    from vidax import pipeline
    from vidax.data import read_prompt

    free, canonical = "a red square moving right", "a red square bouncing slowly to the right"
    assert read_prompt(get("tiny"), free) == canonical
    spec = dataclasses.replace(get("tiny"), caption_grammar=None)  # prompts as written
    assert read_prompt(spec, free) == free
    # generate reads the prompt first: the free phrasing makes the canonical caption's video.
    small = dict(num_frames=1, height=32, width=32, steps=1, seed=0, decode_frames=False)
    a, b = (pipeline.generate("tiny", p, **small).latents for p in (free, canonical))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    c = pipeline.generate(spec, free, **small).latents
    assert not np.array_equal(np.asarray(a), np.asarray(c))
    with pytest.raises(ValueError, match="caption_grammar must be None or 'shapes'"):
        dataclasses.replace(get("tiny-v1"), caption_grammar="english")
