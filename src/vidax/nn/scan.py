"""Stacked layers: built once with a leading "layers" axis, run under one `jax.lax.scan`.

Every transformer in vidax keeps its identical blocks as one module whose parameters carry a
leading "layers" axis (`stack_layers`) and runs them with `scan_layers`, so compile time and
program size do not grow with depth:

    self.blocks = stack_layers(config.num_layers, lambda rngs: Block(config, rngs=rngs), rngs)
    x = scan_layers(self.blocks, x, lambda block, x: block(x, cond), remat=config.remat)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def stack_layers(num_layers: int, make: Callable[[nnx.Rngs], nnx.Module], rngs: nnx.Rngs):
    """`num_layers` independently initialised copies of `make(rngs)`, stacked on a "layers" axis.

    The axis is named in each parameter's sharding metadata (`nnx.PARTITION_NAME`), so the
    sharding rules see "layers" in front of the layer's own logical axes.
    """

    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def build(rngs: nnx.Rngs) -> nnx.Module:
        return make(rngs)

    return build(rngs)


def scan_layers(
    stack: Any,
    carry: Any,
    step: Callable[..., Any],
    *,
    xs: Any = None,
    remat: bool = False,
    layers: int | None = None,
) -> Any:
    """Runs `carry = step(layer, carry)` over stacked layers under one `jax.lax.scan`.

    Args:
        stack: a module stacked on a leading layers axis (`stack_layers`), or a tuple of such
            modules with the same number of layers, which `step` receives layer by layer as a
            tuple.
        carry: what flows from layer to layer (any pytree: tokens, a KV cache, ...).
        step: `(layer, carry) -> carry`, or `(layer, carry, x) -> carry` when `xs` is given.
        xs: optional per-layer inputs (pytree with a leading layers axis), e.g. the layer
            index, handed to `step` as its third argument.
        remat: recompute each layer's activations in the backward pass (`jax.checkpoint`)
            instead of keeping them.
        layers: run only the first `layers` layers (default: all), e.g. to read an
            intermediate hidden state without computing the layers after it.

    Returns:
        The carry after the last layer run.
    """
    graphdef, state = nnx.split(stack)

    def body(carry, inputs):
        layer_state, x = inputs
        layer = nnx.merge(graphdef, layer_state)
        return (step(layer, carry) if xs is None else step(layer, carry, x)), None

    if remat:
        body = jax.checkpoint(body, prevent_cse=False)
    if layers is not None:
        total = jax.tree.leaves(state)[0].shape[0]
        if not 0 <= layers <= total:
            raise ValueError(f"scan_layers: layers must be in [0, {total}], got {layers}")
        if layers < total:
            # The first layers are indexed inside the loop rather than sliced off before it:
            # XLA materialises a slice, a copy of (nearly) all the stacked parameters.
            def first(carry, i):
                index = lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False)
                return body(carry, jax.tree.map(index, (state, xs)))

            carry, _ = jax.lax.scan(first, carry, jnp.arange(layers))
            return carry
    carry, _ = jax.lax.scan(body, carry, (state, xs))
    return carry
