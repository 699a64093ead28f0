"""SigLIP vision encoder: config reading, shapes, the post-norm over every token, partial layer
runs, checkpoints, preprocess (no torch: transformers parity is in tests/reference)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.checkpoint import CheckpointError, export_state, save_file
from vidax.models.siglip_vision import (
    IGNORED,
    PRESETS,
    SiglipVisionEncoder,
    from_hf_config,
    key_map,
    load,
    preprocess,
)
from vidax.sharding import PARAM_AXES

TINY = PRESETS["siglip-tiny"]
L = TINY.num_hidden_layers
# An image size the patch does not divide (as so400m's 384 / 14): the remainder is not read.
ODD = dataclasses.replace(TINY, image_size=30, patch_size=7)


@nnx.jit
def _apply(model, pixels):
    return model(pixels)


@pytest.fixture(scope="module")
def model():
    return SiglipVisionEncoder(TINY, rngs=nnx.Rngs(0))


def _pixels(seed, b=2, config=TINY):
    shape = (b, config.image_size, config.image_size, config.num_channels)
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


# -- config ----------------------------------------------------------------------------------------

# google/siglip-so400m-patch14-384's vision tower as HunyuanVideo-1.5 I2V's image_encoder/ stores
# it (a transformers 4.x `SiglipVisionModel` export).
_HF = {
    "architectures": ["SiglipVisionModel"],
    "attention_dropout": 0.0,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "image_size": 384,
    "intermediate_size": 4304,
    "layer_norm_eps": 1e-06,
    "model_type": "siglip_vision_model",
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 27,
    "patch_size": 14,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.44.2",
}


def test_from_hf_config_reads_so400m_vision_and_full_siglip_configs():
    so400m = PRESETS["siglip-so400m-patch14-384"]
    assert from_hf_config(_HF) == dataclasses.replace(so400m, param_dtype="bfloat16")
    # The two-tower config lists only the sizes: the rest are transformers' SigLIP defaults.
    sizes = {k: _HF[k] for k in ("hidden_size", "image_size", "intermediate_size")}
    vision = {**sizes, "model_type": "siglip_vision_model", "num_attention_heads": 16}
    vision |= {"num_hidden_layers": 27, "patch_size": 14}
    full = {"model_type": "siglip", "text_config": {}, "vision_config": vision}
    assert from_hf_config({**full, "torch_dtype": "float32"}) == so400m
    assert from_hf_config({**_HF, "vision_use_head": False}, dtype="bfloat16").dtype == "bfloat16"
    assert from_hf_config({**_HF, "image_size": [384, 384]}).image_size == 384


@pytest.mark.parametrize(
    "change, match",
    [
        ({"model_type": "clip_vision_model"}, "not a SigLIP vision config"),
        ({"use_flash": True}, re.escape("unknown SigLIP vision config keys ['use_flash']")),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"image_size": [384, 256]}, "non-square image_size"),
        ({"pruned_heads": {"0": [1]}}, "pruned_heads"),
    ],
)
def test_from_hf_config_names_what_it_cannot_take(change, match):
    with pytest.raises(ValueError, match=match):
        from_hf_config({**_HF, **change})
    with pytest.raises(ValueError, match=re.escape("lacks ['patch_size']")):
        from_hf_config({k: v for k, v in _HF.items() if k != "patch_size"})


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_size=0), "SiglipVisionConfig.hidden_size must be positive"),
        (dict(num_attention_heads=3), "divisible"),
        (dict(patch_size=33), "larger than image_size"),
        (dict(hidden_act="quick_gelu_tanh"), "hidden_act"),
        (dict(param_dtype="float64"), "param_dtype"),
    ],
)
def test_config_rejects_bad_values(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **change)


def test_so400m_preset_builds_abstractly_with_logical_axes():
    config = PRESETS["siglip-so400m-patch14-384"]
    assert (config.grid, config.num_tokens, config.head_dim) == (27, 729, 72)
    abstract = nnx.eval_shape(lambda: SiglipVisionEncoder(config, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(
        nnx.state(abstract, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    assert sum(int(np.prod(v.shape)) for v in leaves) == config.num_params
    for v in leaves:
        axes = v.get_metadata()["out_sharding"]
        assert len(axes) == len(v.shape) and set(axes) - {None} <= PARAM_AXES, axes


# -- forward ---------------------------------------------------------------------------------------


def test_every_token_is_post_normed_and_hidden_states_are_layer_prefixes(model):
    pixels = _pixels(0)
    last = _apply(model, pixels)
    assert last.shape == (2, TINY.num_tokens, TINY.hidden_size) and last.dtype == jnp.float32
    hidden = model.hidden_states(pixels)
    np.testing.assert_allclose(last, model.post_norm(hidden), rtol=1e-6, atol=1e-6)
    # Layer by layer, unscanned: hidden state i is the embeddings after i layers.
    graphdef, state = nnx.split(model.blocks)
    x = model.embed(pixels)
    for i in range(L + 1):
        np.testing.assert_allclose(model.hidden_states(pixels, i), x, rtol=1e-5, atol=1e-5)
        if i < L:
            x = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))(x)
    np.testing.assert_array_equal(model.hidden_states(pixels, -1), model.hidden_states(pixels, L))
    with pytest.raises(ValueError, match="layer"):
        model.hidden_states(pixels, L + 1)


def test_pixels_past_the_last_whole_patch_are_not_read():
    model = SiglipVisionEncoder(ODD, rngs=nnx.Rngs(1))
    pixels = np.asarray(_pixels(1, config=ODD))
    changed = pixels.copy()
    changed[:, 28:] = 9.0  # 30 // 7 = 4 patches a side: rows and columns 28, 29 are unread
    changed[:, :, 28:] = -9.0
    assert ODD.num_tokens == 16
    np.testing.assert_array_equal(_apply(model, jnp.asarray(changed)), _apply(model, pixels))


def test_bad_pixels_raise(model):
    with pytest.raises(ValueError, match=re.escape("(b, 32, 32, 3) channels-last (see siglip")):
        model(jnp.zeros((1, 3, 32, 32)))


# -- checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["vision_model.", ""])
def test_save_load_round_trip_with_either_prefix(model, tmp_path, prefix):
    tensors = export_state(nnx.state(model, nnx.Param), key_map(TINY, prefix=prefix))
    assert f"{prefix}embeddings.patch_embedding.bias" in tensors
    assert f"{prefix}post_layernorm.weight" in tensors
    # The pooling head of a `SiglipVisionModel` export is skipped by name.
    tensors[f"{prefix}head.probe"] = np.zeros((1, 1, TINY.hidden_size), np.float32)
    assert f"{prefix}head.*" in IGNORED
    save_file(tensors, tmp_path / "m.safetensors")
    loaded = load(tmp_path / "m.safetensors", TINY)
    pixels = _pixels(2)
    np.testing.assert_array_equal(_apply(loaded, pixels), _apply(model, pixels))


def test_missing_and_unexpected_keys_are_named(model, tmp_path):
    tensors = export_state(nnx.state(model, nnx.Param), key_map(TINY))
    del tensors["vision_model.embeddings.patch_embedding.bias"]
    tensors["vision_model.pre_layrnorm.weight"] = np.ones(TINY.hidden_size, np.float32)
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError) as e:
        load(tmp_path / "m.safetensors", TINY)
    assert "patch_embedding.bias" in str(e.value) and "pre_layrnorm" in str(e.value)


# -- preprocess ------------------------------------------------------------------------------------


def test_preprocess_resizes_to_the_square_and_maps_to_minus_one_one():
    s = TINY.image_size
    same = np.random.default_rng(0).integers(0, 256, (2, s, s, 3), dtype=np.uint8)
    out = preprocess(same, TINY)
    assert out.shape == (2, s, s, 3) and out.dtype == np.float32
    # Already square at the size: no resampling, (x / 255 - 0.5) / 0.5.
    np.testing.assert_allclose(out, same / 127.5 - 1.0, rtol=0, atol=1e-6)
    # Any other shape is squeezed to the square, not cropped: a flat image stays flat.
    flat = np.full((1, 45, 90, 3), 200, np.uint8)
    np.testing.assert_allclose(preprocess(flat, TINY), 200 / 127.5 - 1.0, atol=1e-6)
    np.testing.assert_array_equal(preprocess(same / 255.0, TINY), out)
    with pytest.raises(ValueError, match="RGB"):
        preprocess(np.zeros((40, 40, 3), np.uint8), TINY)
