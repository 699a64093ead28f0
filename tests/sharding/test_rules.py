"""Logical-axis rules: spec resolution, vocabulary, and sharded == single-device execution."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from vidax.models.wan import PRESETS, WanTransformer
from vidax.sharding import (
    PARAM_AXES,
    STRATEGIES,
    Strategy,
    logical_to_spec,
    param_shardings,
    shard,
    use_mesh,
)

CONFIG = dataclasses.replace(
    PRESETS["tiny"], dim=64, num_heads=4, ffn_dim=128, num_layers=2, text_len=8, text_dim=16
)


def test_logical_to_spec_drops_absent_small_and_indivisible_axes():
    mesh = jax.make_mesh((2, 4, 1), ("data", "seq", "tensor"))
    rules = (("batch", ("data", "fsdp")), ("tokens", "seq"), ("embed", "tensor"))
    assert logical_to_spec(("batch", "tokens", "embed"), rules, mesh) == P("data", "seq", None)
    # 6 tokens do not divide over seq=4: replicated rather than padded.
    assert logical_to_spec(("batch", "tokens"), rules, mesh, (2, 6)) == P("data", None)
    # A mesh axis is used at most once per spec.
    assert logical_to_spec(("tokens", "tokens"), rules, mesh) == P("seq", None)


def test_strategies_validate_their_names():
    with pytest.raises(ValueError, match="unknown logical axis"):
        Strategy(name="bad", params=(("embedding", "fsdp"),))
    with pytest.raises(ValueError, match="unknown mesh axis"):
        Strategy(name="bad", activations=(("batch", "model"),))
    mesh = jax.make_mesh((8,), ("model",))
    with pytest.raises(ValueError, match="not vidax mesh axes"), use_mesh(mesh):
        pass
    with (
        pytest.raises(ValueError, match="unknown sharding strategy"),
        use_mesh(jax.make_mesh((8,), ("data",)), "nope"),
    ):
        pass


def test_every_parameter_uses_the_vocabulary():
    model = nnx.eval_shape(lambda: WanTransformer(PRESETS["wan2.1-14b"], rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(
        nnx.state(model, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    assert leaves
    for variable in leaves:
        axes = variable.get_metadata()["out_sharding"]
        assert len(axes) == variable.get_value().ndim
        assert set(axes) - {None} <= PARAM_AXES, axes


def test_shard_is_a_noop_outside_a_mesh_and_checks_rank():
    x = jnp.ones((2, 3))
    assert shard(x, ("batch", "tokens")) is x
    with use_mesh(jax.make_mesh((8,), ("data",)), "dp"), pytest.raises(ValueError, match="rank-2"):
        shard(x, ("batch",))


def _inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 2, 8, 8, CONFIG.in_channels)), jnp.float32)
    t = jnp.asarray([900.0, 100.0])
    ctx = jnp.asarray(rng.standard_normal((2, CONFIG.text_len, CONFIG.text_dim)), jnp.float32)
    return x, t, ctx


@pytest.mark.parametrize(
    "strategy, shape, axes",
    [
        ("dp", (8,), ("data",)),
        ("fsdp", (2, 4), ("data", "fsdp")),
        ("fsdp_sp", (2, 4), ("fsdp", "seq")),
        ("ulysses", (2, 4), ("data", "seq")),
        ("tp_sp", (2, 2, 2), ("fsdp", "seq", "tensor")),
    ],
)
def test_sharded_forward_equals_single_device(strategy, shape, axes):
    model = WanTransformer(CONFIG, rngs=nnx.Rngs(0))
    x, t, ctx = _inputs()
    want = jax.jit(lambda m, *a: m(*a))(model, x, t, ctx)

    mesh = jax.make_mesh(shape, axes)
    with use_mesh(mesh, strategy):
        state = nnx.state(model)
        sharded = nnx.merge(nnx.graphdef(model), jax.device_put(state, param_shardings(state)))

        @jax.jit
        def run(m, x, t, ctx):
            return m(x, t, ctx)

        got = run(sharded, x, t, ctx)
        text = run.lower(sharded, x, t, ctx).compile().as_text()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    if strategy != "dp":  # the strategy really partitions: collectives appear in the program
        assert any(
            op in text
            for op in (
                "all-gather",
                "all-reduce",
                "all-to-all",
                "reduce-scatter",
                "collective-permute",
            )
        )


def test_param_shardings_follow_the_strategy():
    model = nnx.eval_shape(lambda: WanTransformer(CONFIG, rngs=nnx.Rngs(0)))
    mesh = jax.make_mesh((2, 4), ("fsdp", "tensor"))
    shardings = param_shardings(nnx.state(model), mesh, STRATEGIES["tp_sp"])
    q = shardings["blocks"]["attn1"]["to_q"]["kernel"]
    assert q.spec == P(None, "fsdp", "tensor")  # (layers, embed, heads)
    assert shardings["blocks"]["ffn"]["proj_out"]["kernel"].spec == P(None, "tensor", "fsdp")
