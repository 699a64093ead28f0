"""The shared train step: one optax update, the EMA, the lr scale, frozen entries, one compile."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from vidax.train.optim import OptimConfig, ema_decay_at, make_optimizer
from vidax.train.step import init_state, train_update

DECAY = 0.9


def _problem():
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = make_optimizer(OptimConfig(lr=0.1, warmup=0, grad_clip=0.5, weight_decay=0.1))

    def loss_fn(params, inputs, key):
        pred = nnx.merge(graphdef, params)(inputs["x"])
        noise = jax.random.normal(key, pred.shape)
        loss = jnp.mean(jnp.square(pred + noise - inputs.get("target", 0.0)))
        return loss, {"mean": jnp.mean(pred)}

    inputs = {"x": jnp.arange(8.0, dtype=jnp.float32).reshape(2, 4)}
    return params, optimizer, loss_fn, inputs


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _reference(params, optimizer, loss_fn, inputs, key, lr=None):
    """One update written out by hand: the step must do exactly this."""
    (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, inputs, key)
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    if lr is not None:
        updates = jax.tree.map(lambda u: lr * u, updates)
    return optax.apply_updates(params, updates), loss, optax.tree.norm(grads)


@pytest.mark.parametrize("lr", [None, 0.25])
def test_one_step_is_the_optax_update_and_the_ema(lr):
    params, optimizer, loss_fn, inputs = _problem()
    key = jax.random.key(3)
    expected, loss, grad_norm = _reference(params, optimizer, loss_fn, inputs, key, lr)
    step = train_update(loss_fn, optimizer, ema_decay=DECAY)
    args = () if lr is None else (jnp.float32(lr),)
    state, metrics = step(init_state(_copy(params), optimizer), inputs, key, *args)

    leaves = jax.tree.leaves(state["params"])
    for got, want in zip(leaves, jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    assert not np.allclose(leaves[0], jax.tree.leaves(params)[0])  # the step did move them
    d = float(ema_decay_at(jnp.int32(0), DECAY))
    ema = jax.tree.map(lambda p0, p1: d * p0 + (1 - d) * p1, params, state["params"])
    for got, want in zip(jax.tree.leaves(state["ema"]), jax.tree.leaves(ema), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    assert int(state["step"]) == 1
    assert set(metrics) == {"mean", "loss", "grad_norm"}
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-6)
    np.testing.assert_allclose(metrics["grad_norm"], grad_norm, rtol=1e-6)


def test_without_ema_decay_no_ema_is_kept():
    params, optimizer, loss_fn, inputs = _problem()
    state = init_state(_copy(params), optimizer, ema=False)
    step = train_update(loss_fn, optimizer)
    state, _ = step(state, inputs, jax.random.key(0))
    assert set(state) == {"params", "opt", "step"}


def test_frozen_entries_reach_the_loss_and_never_move():
    params, optimizer, loss_fn, inputs = _problem()
    target = jnp.full((2, 3), 5.0, jnp.float32)
    state = {**init_state(_copy(params), optimizer), "target": jnp.copy(target)}
    state["other"] = jnp.arange(3.0)  # not handed to the loss, still carried
    step = train_update(loss_fn, optimizer, ema_decay=DECAY, frozen=("target",))
    state, metrics = step(state, inputs, jax.random.key(1))
    _assert_trees_equal(state["target"], target)
    _assert_trees_equal(state["other"], jnp.arange(3.0))
    # The loss saw the frozen target: the same loss as with the target passed as an input.
    _, want, _ = _reference(
        params, optimizer, loss_fn, {**inputs, "target": target}, jax.random.key(1)
    )
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-6)


def test_the_learning_rate_never_recompiles():
    params, optimizer, loss_fn, inputs = _problem()
    step = train_update(loss_fn, optimizer, ema_decay=DECAY)
    state = init_state(_copy(params), optimizer)
    for i in range(3):
        state, _ = step(state, inputs, jax.random.key(i), jnp.float32(0.1 * (i + 1)))
    assert step._cache_size() == 1
