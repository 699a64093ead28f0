"""CLIP vision encoder: config validation, shapes, partial layer runs, checkpoints, preprocess."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.checkpoint import CheckpointError, export_state, save_file, save_model
from vidax.models.clip_vision import (
    IGNORED,
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PRESETS,
    CLIPVisionEncoder,
    from_hf_config,
    key_map,
    load,
    preprocess,
)
from vidax.sharding import PARAM_AXES, make_mesh, use_mesh

TINY = PRESETS["tiny"]
L = TINY.num_hidden_layers


@nnx.jit(static_argnames="layer")
def _hidden(model, pixels, layer=-2):
    return model.hidden_states(pixels, layer)


@nnx.jit
def _apply(model, pixels):
    return model(pixels)


@pytest.fixture(scope="module")
def model():
    return CLIPVisionEncoder(TINY, rngs=nnx.Rngs(0))


def _pixels(seed, b=2, config=TINY):
    shape = (b, config.image_size, config.image_size, config.num_channels)
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


# -- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(hidden_size=0), "hidden_size"),
        (dict(num_hidden_layers=-1), "num_hidden_layers"),
        (dict(num_attention_heads=5), "divisible"),
        (dict(patch_size=33), "larger than image_size"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps"),
        (dict(hidden_act="relu"), "hidden_act"),
        (dict(dtype="int8"), "dtype"),
        (dict(param_dtype="float64"), "param_dtype"),
        (dict(attention_impl="flash"), "attention_impl"),
    ],
)
def test_config_rejects_bad_values(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TINY, **change)


_HF = {
    "architectures": ["CLIPVisionModelWithProjection"],
    "attention_dropout": 0.0,
    "dropout": 0.0,
    "hidden_act": "gelu",
    "hidden_size": 1280,
    "image_size": 224,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "layer_norm_eps": 1e-05,
    "model_type": "clip_vision_model",
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 32,
    "patch_size": 14,
    "projection_dim": 1024,
    "torch_dtype": "float32",
    "transformers_version": "4.48.0.dev0",
}


def test_from_hf_config_reads_vit_h_and_full_clip_configs():
    assert from_hf_config(_HF) == PRESETS["clip-vit-h-14"]
    full = {"model_type": "clip", "projection_dim": 1024, "text_config": {}, "vision_config": _HF}
    assert from_hf_config(full) == PRESETS["clip-vit-h-14"]
    assert from_hf_config({**_HF, "torch_dtype": "bfloat16"}).param_dtype == "bfloat16"
    assert from_hf_config(_HF, dtype="bfloat16").dtype == "bfloat16"
    # transformers' default activation when the key is absent.
    assert from_hf_config({k: v for k, v in _HF.items() if k != "hidden_act"}).hidden_act == (
        "quick_gelu"
    )


@pytest.mark.parametrize(
    "change, match",
    [
        ({"hidden_act": "silu"}, "hidden_act"),
        ({"use_flash": True}, re.escape("['use_flash']")),
        ({"pruned_heads": {"0": [1]}}, "pruned_heads"),
        ({"model_type": "siglip_vision_model"}, "siglip"),
        ({"patch_size": None}, None),
    ],
)
def test_from_hf_config_names_what_it_cannot_take(change, match):
    config = {**_HF, **change}
    if change == {"patch_size": None}:
        del config["patch_size"]
        match = re.escape("lacks ['patch_size']")
    with pytest.raises(ValueError, match=match):
        from_hf_config(config)


def test_vit_h_preset_builds_abstractly_with_logical_axes():
    config = PRESETS["clip-vit-h-14"]
    assert config.num_tokens == 257 and config.head_dim == 80
    abstract = nnx.eval_shape(lambda: CLIPVisionEncoder(config, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    leaves = jax.tree.leaves(params, is_leaf=lambda v: isinstance(v, nnx.Variable))
    assert sum(int(np.prod(v.shape)) for v in leaves) == config.num_params
    for v in leaves:
        axes = v.get_metadata()["out_sharding"]
        assert len(axes) == len(v.shape)
        assert set(axes) - {None} <= PARAM_AXES, axes
    blocks = jax.tree.leaves(params["blocks"], is_leaf=lambda v: isinstance(v, nnx.Variable))
    assert all(v.get_metadata()["out_sharding"][0] == "layers" for v in blocks)
    assert all(v.shape[0] == config.num_hidden_layers for v in blocks)


# -- forward ---------------------------------------------------------------------------------------


def test_shapes_and_pooled_output(model):
    pixels = _pixels(0)
    last, pooled = _apply(model, pixels)
    assert last.shape == (2, TINY.num_tokens, TINY.hidden_size) and last.dtype == jnp.float32
    assert pooled.shape == (2, TINY.hidden_size) and pooled.dtype == jnp.float32
    assert np.isfinite(np.asarray(last)).all()
    np.testing.assert_allclose(pooled, model.post_norm(last[:, 0]), rtol=1e-6, atol=1e-6)
    # The hidden states are un-normed: the post-norm is applied to the class token only.
    assert np.abs(np.asarray(last).std(-1) - 1).max() > 1e-2


def test_every_hidden_state_is_a_prefix_of_the_layers(model):
    @nnx.jit
    def both(model, pixels):
        got = [model.hidden_states(pixels, i) for i in (*range(L + 1), -(L + 1), -1)]
        graphdef, state = nnx.split(model.blocks)
        want = [model.embed(pixels)]
        for i in range(L):  # layer by layer, unscanned
            block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
            want.append(block(want[-1]))
        return got, want, model(pixels)[0]

    got, want, last = both(model, _pixels(1))
    for i, (g, w) in enumerate(zip(got, [*want, want[0], want[-1]], strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"hidden state {i}")
    np.testing.assert_array_equal(got[-1], last)


def _slice_blocks(model, start, stop):
    graphdef, state = nnx.split(model.blocks)
    return graphdef, jax.tree.map(lambda a: a[start:stop], state)


def test_penultimate_equals_a_model_without_the_last_layer(model):
    shorter = CLIPVisionEncoder(
        dataclasses.replace(TINY, num_hidden_layers=L - 1), rngs=nnx.Rngs(1)
    )
    state = nnx.state(model, nnx.Param)
    nnx.update(shorter, {k: v for k, v in state.items() if k != "blocks"})
    nnx.update(shorter.blocks, _slice_blocks(model, 0, L - 1)[1])
    pixels = _pixels(2)
    penultimate = _hidden(model, pixels)
    np.testing.assert_array_equal(penultimate, _apply(shorter, pixels)[0])
    # ...and it is not the last layer's output.
    assert np.abs(np.asarray(penultimate - _apply(model, pixels)[0])).max() > 1e-3


def test_penultimate_does_not_copy_the_stacked_parameters():
    # Indexing the first layers in place, not slicing them: a slice would add (L-1)/L of the
    # layer parameters to the program's temporaries.
    config = dataclasses.replace(TINY, hidden_size=128, intermediate_size=512, num_hidden_layers=8)
    model = CLIPVisionEncoder(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    block_bytes = sum(a.nbytes for a in jax.tree.leaves(nnx.state(model.blocks)))

    def temp(layer):
        fn = lambda state, pixels: nnx.merge(graphdef, state).hidden_states(pixels, layer)
        compiled = jax.jit(fn).lower(state, _pixels(0, 1, config)).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp(-2) < temp(-1) + block_bytes // 4


def test_bad_inputs_raise(model):
    with pytest.raises(ValueError, match=re.escape("(b, 32, 32, 3)")):
        model.hidden_states(jnp.zeros((1, 3, 32, 32)))
    with pytest.raises(ValueError, match=re.escape("(b, 32, 32, 3)")):
        model(jnp.zeros((1, 48, 48, 3)))
    with pytest.raises(ValueError, match="layer"):
        model.hidden_states(_pixels(0), layer=L + 1)
    with pytest.raises(ValueError, match="layer"):
        model.hidden_states(_pixels(0), layer=-(L + 2))


def test_bfloat16_tracks_float32(model):
    config = dataclasses.replace(TINY, dtype="bfloat16", param_dtype="bfloat16")
    low = CLIPVisionEncoder(config, rngs=nnx.Rngs(0))
    nnx.update(low, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    pixels = _pixels(3)
    want, got = np.asarray(_hidden(model, pixels)), np.asarray(_hidden(low, pixels))
    assert got.dtype == np.float32
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_sharded_forward_matches_single_device(model, tmp_path):
    save_model(model, tmp_path / "m.safetensors", key_map(TINY))
    mesh = make_mesh((2, 2, 2), ("data", "fsdp", "tensor"))
    sharded = load(tmp_path / "m.safetensors", TINY, mesh=mesh, strategy="tp_sp")
    assert not sharded.blocks.mlp.proj_in.kernel[...].sharding.is_fully_replicated
    pixels = _pixels(4, b=4)
    with use_mesh(mesh, "tp_sp"):
        got = _hidden(sharded, pixels)
    np.testing.assert_allclose(got, _hidden(model, pixels), rtol=1e-5, atol=1e-5)


# -- checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["vision_model.", ""])
def test_save_load_round_trip_with_either_prefix(model, tmp_path, prefix):
    tensors = export_state(nnx.state(model, nnx.Param), key_map(TINY, prefix=prefix))
    assert f"{prefix}pre_layrnorm.weight" in tensors
    assert f"{prefix}encoder.layers.{L - 1}.self_attn.out_proj.bias" in tensors
    save_file(tensors, tmp_path / "m.safetensors")
    loaded = load(tmp_path / "m.safetensors", TINY)
    pixels = _pixels(5)
    np.testing.assert_array_equal(_hidden(loaded, pixels), _hidden(model, pixels))


def _tensors(model):
    return export_state(nnx.state(model, nnx.Param), key_map(TINY))


def test_listed_extra_keys_are_ignored_and_others_named(model, tmp_path):
    tensors = _tensors(model)
    tensors["visual_projection.weight"] = np.zeros((16, TINY.hidden_size), np.float32)
    tensors["vision_model.embeddings.position_ids"] = np.arange(TINY.num_tokens)[None]
    tensors["text_model.final_layer_norm.weight"] = np.ones(8, np.float32)
    assert "visual_projection.weight" in IGNORED
    save_file(tensors, tmp_path / "m.safetensors")
    load(tmp_path / "m.safetensors", TINY)
    tensors["vision_model.head.weight"] = np.zeros((4, 4), np.float32)
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=re.escape("unexpected key 'vision_model.head")):
        load(tmp_path / "m.safetensors", TINY)


def test_missing_and_misshapen_keys_are_named(model, tmp_path):
    tensors = _tensors(model)
    del tensors["vision_model.encoder.layers.1.mlp.fc2.bias"]
    key = "vision_model.embeddings.position_embedding.weight"
    tensors[key] = np.zeros((TINY.num_tokens + 1, TINY.hidden_size), np.float32)
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError) as e:
        load(tmp_path / "m.safetensors", TINY)
    assert "vision_model.encoder.layers.1.mlp.fc2.bias" in str(e.value) and key in str(e.value)


# -- preprocess ------------------------------------------------------------------------------------


def _normalised(uint8):
    return (uint8.astype(np.float32) / 255 - np.float32(OPENAI_CLIP_MEAN)) / np.float32(
        OPENAI_CLIP_STD
    )


def test_preprocess_centre_crops_without_resizing_when_the_short_side_fits():
    # Height already image_size: no resampling, the crop is the middle of the width.
    s = TINY.image_size
    images = np.random.default_rng(0).integers(0, 256, (2, s, 3 * s + 1, 3), dtype=np.uint8)
    out = preprocess(images, TINY)
    assert out.shape == (2, s, s, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, _normalised(images[:, :, s : 2 * s]), rtol=0, atol=1e-6)
    tall = images.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(
        preprocess(tall, TINY), _normalised(tall[:, s : 2 * s]), rtol=0, atol=1e-6
    )


def test_preprocess_resizes_the_short_side_and_takes_floats():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (1, 50, 70, 3), dtype=np.uint8)
    out = preprocess(images, TINY)
    assert out.shape == (1, TINY.image_size, TINY.image_size, 3)
    # A flat image stays flat through bicubic resampling.
    flat = np.full((1, 45, 90, 3), 200, np.uint8)
    np.testing.assert_allclose(preprocess(flat, TINY), _normalised(flat[:, :32, :32]), atol=1e-6)
    np.testing.assert_array_equal(preprocess(images / 255.0, TINY), out)


def test_preprocess_rejects_bad_images():
    with pytest.raises(ValueError, match="RGB"):
        preprocess(np.zeros((40, 40, 3), np.uint8), TINY)
    with pytest.raises(ValueError, match="RGB"):
        preprocess(np.zeros((1, 40, 40, 4), np.uint8), TINY)
    with pytest.raises(ValueError, match="int16"):
        preprocess(np.zeros((1, 40, 40, 3), np.int16), TINY)
