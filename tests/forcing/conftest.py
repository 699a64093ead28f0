"""Small causal models shared by the forcing tests (built once per session)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from vidax.forcing import CausalWan
from vidax.models.wan import PRESETS

# Two layers of the tiny preset: the architecture under test, a quarter of the compile time.
SMALL = dataclasses.replace(PRESETS["tiny"], num_layers=2)


@pytest.fixture(scope="session")
def small_model() -> CausalWan:
    model = CausalWan(SMALL, rngs=nnx.Rngs(0))
    # Non-zero sparse heads so tests exercise the gates and the learned compression.
    state = nnx.state(model.sparse)
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda x: 0.05 * rng.standard_normal(x.shape).astype(x.dtype), state)
    nnx.update(model.sparse, state)
    return model


@pytest.fixture(scope="session")
def zero_init_model() -> CausalWan:
    """Random transformer, sparse heads at their zero init (sparse starts as dense)."""
    return CausalWan(SMALL, rngs=nnx.Rngs(1))


@pytest.fixture(scope="session")
def context() -> jax.Array:
    return jax.random.normal(jax.random.key(7), (1, SMALL.text_len, SMALL.text_dim))
