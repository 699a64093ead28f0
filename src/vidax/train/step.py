"""The train step every stage shares: gradients, one optax update, the weight EMA.

A train state is a dict {"params", "opt", "ema", "step"} (`init_state`), possibly with frozen
entries beside them (a teacher's parameters, say) that the step hands to the loss and carries
through unchanged:

    step = train_update(loss_fn, optimizer, ema_decay=0.999)
    state, metrics = step(state, batch, key)  # the optimizer runs its own schedule
    state, metrics = step(state, batch, key, lr)  # an optimizer built at lr 1, scaled per step

`vidax.train.loop.make_step` binds it to the loop (the key drawn from the step count); the
recipe (`vidax.train.recipe`) passes the key and learning rate of its timed schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from vidax.train.optim import ema_update

LossFn = Callable[[Any, Any, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def init_state(
    params: nnx.State | dict[str, nnx.State],
    optimizer: optax.GradientTransformation,
    *,
    ema: bool = True,
) -> dict[str, Any]:
    """A fresh train state {"params", "opt", "ema", "step"}; the EMA starts at the params.

    Args:
        params: the trained parameters (any pytree).
        optimizer: the transformation whose state becomes "opt".
        ema: keep an "ema" entry (for a step with an `ema_decay`).
    """
    state = {"params": params, "opt": optimizer.init(params), "step": jnp.zeros((), jnp.int32)}
    if ema:
        state["ema"] = jax.tree.map(jnp.copy, params)
    return state


def train_update(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    ema_decay: float | None = None,
    frozen: Sequence[str] = (),
) -> Callable:
    """A jitted step `(state, inputs, key, lr=None) -> (state, metrics)`, the state donated.

    The step differentiates `loss_fn(state["params"], inputs, key)` with respect to the
    parameters, applies `optimizer`'s update (multiplied by `lr` when given), advances the EMA
    and the step count, and returns the loss's metrics with "loss" and "grad_norm" (the global
    norm of the raw gradients) added. State entries other than params, opt, ema and step are
    returned as they are.

    Args:
        loss_fn: (params, inputs, key) -> (scalar loss, dict of scalar metrics).
        optimizer: the optax transformation whose state is `state["opt"]`; built with
            `vidax.train.optim.make_optimizer`, it also runs under strict dtype promotion.
        ema_decay: decay of `state["ema"]` (see `vidax.train.optim.ema_update`); None: no
            EMA is kept.
        frozen: names of state entries (e.g. a teacher's parameters) added to `inputs`, a
            dict, under the same names: saved with the state, never differentiated or updated.

    Returns:
        The jitted step. `lr` is a traced scalar, so a schedule run outside the program never
        recompiles it; it suits an optimizer built at learning rate 1 (for AdamW's decoupled
        weight decay, scaling its update by `lr` is the same as building it at `lr`).
    """
    frozen = tuple(frozen)

    def step(state, inputs, key, lr=None):
        if frozen:
            inputs = {**inputs, **{name: state[name] for name in frozen}}
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"], inputs, key
        )
        updates, opt = optimizer.update(grads, state["opt"], state["params"])
        if lr is not None:
            updates = jax.tree.map(lambda u: (lr * u).astype(u.dtype), updates)
        params = optax.apply_updates(state["params"], updates)
        new = {**state, "params": params, "opt": opt, "step": state["step"] + 1}
        if ema_decay is not None:
            new["ema"] = ema_update(state["ema"], params, state["step"], ema_decay)
        metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
        return new, metrics

    return jax.jit(step, donate_argnums=0)
