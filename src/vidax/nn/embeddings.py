"""Sinusoidal timestep embeddings."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float


def timestep_embedding(
    t: Float[Array, "*b"],
    dim: int,
    *,
    flip_sin_to_cos: bool = True,
    freq_shift: float = 0.0,
    max_period: float = 10_000.0,
) -> Float[Array, "*b dim"]:
    """Sinusoidal features of (possibly fractional) timesteps, as diffusers' `Timesteps`.

    Frequencies are exp(-log(max_period) * i / (dim/2 - freq_shift)); the output is
    [cos, sin] when `flip_sin_to_cos` (Wan, HunyuanVideo) else [sin, cos]. Float32.
    """
    half = dim // 2
    exponent = -math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / (half - freq_shift)
    angles = t.astype(jnp.float32)[..., None] * jnp.expand_dims(
        jnp.exp(exponent), tuple(range(t.ndim))
    )
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    emb = jnp.concatenate([cos, sin] if flip_sin_to_cos else [sin, cos], axis=-1)
    if dim % 2:
        emb = jnp.pad(emb, [(0, 0)] * (emb.ndim - 1) + [(0, 1)])
    return emb
