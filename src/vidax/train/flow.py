"""Rectified-flow (flow-matching) training: noise levels, noisy inputs, the velocity error.

With data x0 and noise eps, the path is x_sigma = (1 - sigma) x0 + sigma eps and the model
regresses the constant velocity v = eps - x0 at timestep 1000 sigma, the convention of Wan and
of `vidax.sampling`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


@dataclasses.dataclass(frozen=True, kw_only=True)
class SigmaSampler:
    """Training noise levels: sigmoid(N(mean, std)) (SD3's logit-normal), then Wan's shift.

    The logit-normal puts most samples at intermediate noise, where the loss is least trivial;
    the shift s maps sigma -> s sigma / (1 + (s - 1) sigma), moving them towards the high-noise
    end where layout, colour and motion are decided (the sampler uses the same shift).
    """

    mean: float = 0.0
    std: float = 1.0
    shift: float = 1.0

    def __post_init__(self):
        if not self.std > 0:
            raise ValueError(f"std must be positive, got {self.std}")
        if not self.shift > 0:
            raise ValueError(f"shift must be positive, got {self.shift}")

    def __call__(self, key: jax.Array, batch: int) -> Float[Array, " b"]:
        """(b,) noise levels in (0, 1)."""
        u = jax.nn.sigmoid(self.mean + self.std * jax.random.normal(key, (batch,), jnp.float32))
        return shift_sigma(u, self.shift)


def shift_sigma(sigma: jax.Array, shift: float) -> jax.Array:
    """Wan/SD3 time shift: s sigma / (1 + (s - 1) sigma)."""
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


def noisy(
    x0: Float[Array, "b ..."], noise: Float[Array, "b ..."], sigma: Float[Array, " b"]
) -> Float[Array, "b ..."]:
    """x_sigma = (1 - sigma) x0 + sigma noise, sigma broadcast over all but the batch axis."""
    s = sigma.reshape((-1,) + (1,) * (x0.ndim - 1)).astype(x0.dtype)
    return (1.0 - s) * x0 + s * noise


def velocity_error(
    model_fn: Callable[[jax.Array, jax.Array], jax.Array],
    x0: Float[Array, "b t h w c"],
    noise: Float[Array, "b t h w c"],
    sigma: Float[Array, " b"],
) -> Float[Array, "b t h w c"]:
    """Squared error between the predicted and the true velocity, per element (float32).

    Args:
        model_fn: (x_sigma, timestep (b,) = 1000 sigma) -> predicted velocity, x0's shape.
        x0: clean latents.
        noise: standard normal, x0's shape.
        sigma: (b,) noise levels in [0, 1].
    """
    x = noisy(x0, noise, sigma)
    v = model_fn(x, 1000.0 * sigma).astype(jnp.float32)
    return jnp.square(v - (noise - x0).astype(jnp.float32))


def weighted_mean(
    err: Float[Array, "b ..."], weight: Float[Array, "b ..."] | None = None
) -> Float[Array, " b"]:
    """Per-example mean of `err`, weighted by `weight` (broadcast against err) if given.

    sum(w err) / sum(w) over all but the batch axis; an example of all-zero weight gives 0.
    """
    axes = tuple(range(1, err.ndim))
    if weight is None:
        return jnp.mean(err, axis=axes)
    weight = jnp.broadcast_to(weight.astype(err.dtype), err.shape)
    return jnp.sum(weight * err, axis=axes) / jnp.maximum(jnp.sum(weight, axis=axes), 1e-6)
