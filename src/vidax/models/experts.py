"""Two experts over the noise levels (Wan 2.2 A14B): one transformer for the high-noise
timesteps, another of the same architecture for the rest.

    model = TwoExperts(high, low, boundary_ratio=0.875)
    v = model(x, timestep, context)   # high(...) if timestep >= 875 else low(...)

It is called like one DiT, so every sampler (the pipeline's loop, DVG's stages, the step cache,
the sharded path) runs it unchanged; the switch is a `lax.cond` on the step's timestep, so only
the active expert computes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vidax.models.dit_stages import VideoDiT

# diffusers' schedulers: timesteps are sigma * 1000.
NUM_TRAIN_TIMESTEPS = 1000


class TwoExperts(nnx.Module):
    """`high` denoises timesteps >= boundary_ratio * 1000 (diffusers' `transformer`), `low`
    the rest (`transformer_2`), as diffusers' `WanPipeline` switches them.

    Raises:
      ValueError: the experts' configs differ, or boundary_ratio is not in (0, 1).
    """

    def __init__(self, high: VideoDiT, low: VideoDiT, boundary_ratio: float):
        if high.config != low.config:
            raise ValueError("the two experts must share one config")
        if not 0 < boundary_ratio < 1:
            raise ValueError(f"boundary_ratio must be in (0, 1), got {boundary_ratio}")
        self.high, self.low = high, low
        self.config = high.config
        self.boundary = float(boundary_ratio) * NUM_TRAIN_TIMESTEPS

    def __call__(
        self, x: Float[Array, "b t h w c"], timestep: jax.Array, *args: Any, **kwargs: Any
    ) -> Float[Array, "b t h w c"]:
        """The active expert's flow prediction. Per-token timesteps (TI2V-style given frames
        at 0) switch on their largest value, the noisy tokens' timestep."""
        high = jnp.max(jnp.asarray(timestep)) >= self.boundary
        return jax.lax.cond(
            high,
            lambda: self.high(x, timestep, *args, **kwargs),
            lambda: self.low(x, timestep, *args, **kwargs),
        )
