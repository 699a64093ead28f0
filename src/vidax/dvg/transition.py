"""Moving latents between nested grids, and the rectified-flow re-noise at a stage boundary.

Grids (see `vidax.dvg.schedule`): a temporal factor f keeps frames {0, f, 2f, ...}; a spatial
factor f averages f x f pixels, so reduced pixel i sits at full-resolution coordinate
f*i + (f - 1)/2 (the half-pixel-centre convention of `jax.image.resize`).

**Transition at a stage boundary.** The stage's last update returns the clean prediction
x0 = x - sigma v on the coarse grid. It is upsampled to the next grid and put back on the flow
at the next stage's entry level sigma':

    x' = (1 - sigma') * up(x0) + sigma' * eps',   eps' ~ N(0, I) on the new grid.

Given x0, x' has exactly the flow's conditional marginal q(x_sigma' | x0) = N((1 - sigma') x0,
sigma'^2 I): mean (1 - sigma') x0 and variance sigma'^2 per element (`tests/dvg` checks this on a
Gaussian toy). `restrict_noise` gives eps' from the run's starting noise (the default: a grid
point sees the same noise at every stage, so the seed gives the same video as full sampling), or
it is drawn fresh.

**Noise on a reduced grid** must stay white with unit variance: frames are subsampled, and
f x f pixel blocks are averaged and multiplied by f (the mean of f^2 unit normals has variance
1/f^2). This is also the low-pass part of the full-resolution noise, so the coarse stages
denoise the same noise that the full grid carries.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from vidax.sampling import renoise

__all__ = ["downsample", "positions", "renoise", "restrict_noise", "upsample"]


def restrict_noise(
    noise: Float[Array, "b t h w c"], factors: tuple[int, int]
) -> Float[Array, "b t2 h2 w2 c"]:
    """Unit-variance white noise on the grid reduced by (t_factor, s_factor).

    Args:
      noise: (b, t, h, w, c) full-resolution standard normal noise.
      factors: (t_factor, s_factor) dividing (t - 1) and (h, w).

    Returns:
      (b, (t - 1) / ft + 1, h / fs, w / fs, c): frames subsampled, pixel blocks averaged * fs.
    """
    ft, fs = factors
    x = noise[:, ::ft]
    if fs == 1:
        return x
    b, t, h, w, c = x.shape
    x = x.reshape(b, t, h // fs, fs, w // fs, fs, c).astype(jnp.float32)
    return (x.mean(axis=(3, 5)) * fs).astype(noise.dtype)


def downsample(
    x: Float[Array, "b t h w c"], factors: tuple[int, int]
) -> Float[Array, "b t2 h2 w2 c"]:
    """A signal on the reduced grid: frames subsampled, f x f pixel blocks averaged."""
    ft, fs = factors
    x = x[:, ::ft]
    if fs == 1:
        return x
    b, t, h, w, c = x.shape
    return x.reshape(b, t, h // fs, fs, w // fs, fs, c).mean(axis=(3, 5))


def upsample(
    x: Float[Array, "b t h w c"],
    shape: tuple[int, int, int],
    *,
    temporal: str = "linear",
    spatial: str = "cubic",
) -> Float[Array, "b T H W c"]:
    """Resizes a latent from a coarse nested grid to a finer one.

    Args:
      x: (b, t, h, w, c) latent on the coarse grid.
      shape: the target (T, H, W), with (T - 1) a multiple of (t - 1) (nested frames) and
        H, W multiples of h, w.
      temporal: "linear" (interpolate between the nested frames) or "nearest".
      spatial: a `jax.image.resize` method ("nearest", "linear", "cubic", "lanczos3", ...).

    Returns:
      (b, T, H, W, c) in x's dtype.
    """
    b, t, h, w, c = x.shape
    tt, hh, ww = shape
    if (t > 1 and (tt - 1) % (t - 1)) or (t == 1 and tt != 1):
        raise ValueError(f"cannot upsample {t} nested frames to {tt}")
    if (h, w) != (hh, ww):
        x = jax.image.resize(x, (b, t, hh, ww, c), method=spatial).astype(x.dtype)
    if tt != t:
        k = (tt - 1) // (t - 1)
        j = jnp.arange(tt)
        lo = j // k
        if temporal == "nearest":
            x = x[:, jnp.minimum((j + k // 2) // k, t - 1)]
        elif temporal == "linear":
            hi = jnp.minimum(lo + 1, t - 1)
            alpha = ((j % k) / k).astype(x.dtype)[None, :, None, None, None]
            x = x[:, lo] * (1 - alpha) + x[:, hi] * alpha
        else:
            raise ValueError(f"unknown temporal upsampling {temporal!r}")
    return x


def positions(
    grid: tuple[int, int, int], factors: tuple[int, int], patch: tuple[int, int, int]
) -> np.ndarray:
    """RoPE positions (l, 3) of a reduced token grid in full-resolution token coordinates.

    A reduced token j covers latent pixels whose centre lies at full-resolution token coordinate
    fs*j + (fs - 1)/2 in h and w, and (temporal patch 1) at frame ft*j, so the model sees the
    geometry of the full grid at a coarser sampling. Built on the host (a compile-time constant).

    Args:
      grid: (t', h', w') token grid of the (padded) reduced latent.
      factors: (t_factor, s_factor).
      patch: the DiT's (pt, ph, pw).

    Returns:
      (t' h' w', 3) float32, row-major like `vidax.nn.video_positions`.
    """
    ft, fs = factors
    pt = patch[0]
    offsets = ((pt - 1) * (ft - 1) / (2 * pt), (fs - 1) / 2, (fs - 1) / 2)
    axes = [
        o + s * np.arange(n, dtype=np.float64)
        for n, o, s in zip(grid, offsets, (ft, fs, fs), strict=True)
    ]
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    return mesh.reshape(-1, 3).astype(np.float32)
