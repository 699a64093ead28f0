"""The layer scan: stacked layers, all or only the first few."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.nn import Linear
from vidax.nn.scan import scan_layers, stack_layers

LAYERS = 4


@pytest.fixture(scope="module")
def stack():
    return stack_layers(
        LAYERS, lambda rngs: Linear(8, 8, axes=("embed", "embed"), rngs=rngs), nnx.Rngs(0)
    )


def _loop(stack, x, layers, xs=None):
    graphdef, state = nnx.split(stack)
    for i in range(layers):
        layer = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
        x = jnp.tanh(layer(x)) + (0 if xs is None else xs[i])
    return x


@pytest.mark.parametrize("layers", [None, 0, 1, LAYERS - 1, LAYERS])
@pytest.mark.parametrize("remat", [False, True])
def test_first_layers_match_a_python_loop(stack, layers, remat):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8)), jnp.float32)
    xs = jnp.arange(LAYERS, dtype=jnp.float32)
    got = scan_layers(
        stack,
        x,
        lambda layer, x, offset: jnp.tanh(layer(x)) + offset,
        xs=xs,
        remat=remat,
        layers=layers,
    )
    want = _loop(stack, x, LAYERS if layers is None else layers, xs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layers", [-1, LAYERS + 1])
def test_layer_count_out_of_range_raises(stack, layers):
    with pytest.raises(ValueError, match=rf"\[0, {LAYERS}\]"):
        scan_layers(stack, jnp.zeros((1, 8)), lambda layer, x: layer(x), layers=layers)
