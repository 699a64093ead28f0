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

    Returns:
        The carry after the last layer.
    """
    graphdef, state = nnx.split(stack)

    def body(carry, inputs):
        layer_state, x = inputs
        layer = nnx.merge(graphdef, layer_state)
        return (step(layer, carry) if xs is None else step(layer, carry, x)), None

    if remat:
        body = jax.checkpoint(body, prevent_cse=False)
    carry, _ = jax.lax.scan(body, carry, (state, xs))
    return carry
