"""Declarative key maps: validation before loading, stacked layers, placement, export."""

import jax
import numpy as np
import pytest
from flax import nnx

from vidax.checkpoint import (
    CheckpointError,
    Rule,
    linear_rules,
    load_model,
    open_checkpoint,
    save_file,
    save_model,
)
from vidax.nn import Linear


class _Block(nnx.Module):
    def __init__(self, *, rngs):
        self.lin = Linear(4, 8, axes=("embed", "mlp"), rngs=rngs)


class _Model(nnx.Module):
    def __init__(self, *, rngs, layers=3):
        self.inp = Linear(3, 4, axes=("patch", "embed"), rngs=rngs)

        @nnx.split_rngs(splits=layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make(rngs):
            return _Block(rngs=rngs)

        self.blocks = make(rngs)


RULES = [*linear_rules("inp", "inp"), *linear_rules("blocks.{i}.lin", "blocks.lin")]


@pytest.fixture
def saved(tmp_path):
    model = _Model(rngs=nnx.Rngs(0))
    path = tmp_path / "m.safetensors"
    save_model(model, path, RULES)
    return model, path


def test_layout_and_round_trip(saved):
    model, path = saved
    reader = open_checkpoint(path)
    # torch layout: Linear weights (out, in), one tensor per layer.
    assert reader.shape("inp.weight") == (4, 3)
    assert reader.shape("blocks.2.lin.weight") == (8, 4)
    np.testing.assert_array_equal(
        reader["blocks.1.lin.weight"], np.asarray(model.blocks.lin.kernel[1]).T
    )
    loaded = load_model(lambda: _Model(rngs=nnx.Rngs(1)), path, RULES)
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded)), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_bfloat16_checkpoints_load_into_float32_models(tmp_path):
    # Real Wan/Hunyuan checkpoints are stored in bf16; ml_dtypes' bfloat16 is not a numpy
    # "floating" subtype, which once made the loader reject every bf16 tensor.
    import ml_dtypes

    model = _Model(rngs=nnx.Rngs(0))
    path = tmp_path / "bf16.safetensors"
    save_model(model, path, RULES, dtype=ml_dtypes.bfloat16)
    assert open_checkpoint(path).dtype("inp.weight") == np.dtype(ml_dtypes.bfloat16)
    loaded = load_model(lambda: _Model(rngs=nnx.Rngs(1)), path, RULES)
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded)), strict=True
    ):
        assert b.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3)


def test_every_problem_is_reported_before_loading(saved, tmp_path):
    _, path = saved
    tensors = dict(open_checkpoint(path))
    tensors.pop("inp.bias")
    tensors["blocks.0.lin.weight"] = tensors["blocks.0.lin.weight"][:, :3]
    tensors["stray"] = np.zeros(2, np.float32)
    tensors["blocks.1.lin.bias"] = np.zeros(8, np.int32)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, bad)
    with pytest.raises(CheckpointError) as err:
        load_model(lambda: _Model(rngs=nnx.Rngs(1)), bad, RULES)
    message = str(err.value)
    assert "missing key 'inp.bias'" in message
    assert "'blocks.0.lin.weight'" in message and "(8, 3)" in message
    assert "unexpected key 'stray'" in message
    assert "'blocks.1.lin.bias'" in message and "int32" in message


@pytest.mark.parametrize("key, value", [("blocks.1.lin.weight", np.nan), ("inp.bias", np.inf)])
def test_non_finite_tensors_are_an_error_naming_file_and_key(saved, tmp_path, key, value):
    # A NaN weight once loaded silently and rendered an all-black video.
    _, path = saved
    tensors = dict(open_checkpoint(path))
    tensors[key] = tensors[key].copy()
    tensors[key].flat[1] = value
    bad = tmp_path / "nan.safetensors"
    save_file(tensors, bad)
    with pytest.raises(CheckpointError, match=f"nan.safetensors: tensor '{key}' has 1 non-finite"):
        load_model(lambda: _Model(rngs=nnx.Rngs(1)), bad, RULES)


def test_more_layers_than_the_model(saved):
    _, path = saved
    with pytest.raises(CheckpointError, match="more layers than the model"):
        load_model(lambda: _Model(rngs=nnx.Rngs(1), layers=2), path, RULES)


def test_incomplete_key_map_is_a_programming_error(saved):
    _, path = saved
    with pytest.raises(ValueError, match="does not cover parameters"):
        load_model(lambda: _Model(rngs=nnx.Rngs(1)), path, RULES[:-1])
    with pytest.raises(ValueError, match="unknown parameter"):
        load_model(lambda: _Model(rngs=nnx.Rngs(1)), path, [*RULES, Rule("x", "nope")])


def test_ignore_patterns(saved, tmp_path):
    _, path = saved
    tensors = dict(open_checkpoint(path))
    tensors["blocks.0.extra.weight"] = np.zeros(1, np.float32)
    extra = tmp_path / "extra.safetensors"
    save_file(tensors, extra)
    load_model(lambda: _Model(rngs=nnx.Rngs(1)), extra, RULES, ignore=["blocks.*.extra.weight"])


def test_placement_with_sharding(saved):
    _, path = saved
    mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"))
    model = load_model(lambda: _Model(rngs=nnx.Rngs(1)), path, RULES, mesh=mesh, strategy="tp_sp")
    # tp_sp: embed -> fsdp, mlp -> tensor; the stacked layers axis stays whole.
    spec = model.blocks.lin.kernel[...].sharding.spec
    assert tuple(spec) == (None, "fsdp", "tensor")
    assert len(model.blocks.lin.kernel[...].sharding.device_set) == 8
    # A dimension the mesh axes do not divide stays replicated instead of being padded.
    assert tuple(model.inp.kernel[...].sharding.spec) == (None, "fsdp")
    model = load_model(
        lambda: _Model(rngs=nnx.Rngs(1)),
        path,
        RULES,
        mesh=jax.make_mesh((8,), ("tensor",)),
        strategy="tp_sp",
    )
    assert tuple(model.blocks.lin.bias[...].sharding.spec) == (None, "tensor")
