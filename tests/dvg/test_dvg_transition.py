"""Transition math: noise restriction, nested upsampling, re-noising and RoPE positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.dvg import downsample, positions, renoise, restrict_noise, upsample
from vidax.nn import video_positions


def test_restricted_noise_is_white_with_unit_variance():
    noise = jax.random.normal(jax.random.key(0), (8, 9, 32, 32, 4), jnp.float32)
    for factors in [(2, 2), (4, 4), (1, 8)]:
        x = np.asarray(restrict_noise(noise, factors), np.float64)
        t = (9 - 1) // factors[0] + 1
        assert x.shape == (8, t, 32 // factors[1], 32 // factors[1], 4)
        assert abs(x.mean()) < 0.03 and abs(x.var() - 1) < 0.05
        # neighbouring pixels uncorrelated
        corr = np.mean(x[:, :, 1:] * x[:, :, :-1])
        assert abs(corr) < 0.05


def test_restricted_noise_is_the_low_pass_of_the_full_noise():
    noise = jax.random.normal(jax.random.key(1), (1, 5, 8, 8, 2), jnp.float32)
    np.testing.assert_allclose(
        restrict_noise(noise, (2, 2)), downsample(noise, (2, 2)) * 2, rtol=1e-6
    )


def test_upsample_keeps_nested_frames_and_interpolates_linear_motion():
    t = jnp.arange(5, dtype=jnp.float32)
    x = jnp.broadcast_to(3.0 * t[None, :, None, None, None] + 1.0, (1, 5, 2, 2, 1))
    up = upsample(x, (9, 2, 2), temporal="linear")
    np.testing.assert_allclose(up[0, ::2], x[0], rtol=1e-6)  # anchors exact
    np.testing.assert_allclose(up[0, :, 0, 0, 0], 1.0 + 1.5 * np.arange(9), rtol=1e-6)
    near = upsample(x, (9, 2, 2), temporal="nearest")
    np.testing.assert_allclose(near[0, ::2], x[0], rtol=1e-6)
    assert set(np.unique(near)) <= set(np.unique(x))


@pytest.mark.parametrize("method", ["nearest", "linear", "cubic", "lanczos3"])
def test_spatial_upsample_preserves_block_means_of_smooth_content(method):
    yy, xx = jnp.meshgrid(jnp.linspace(0, 1, 16), jnp.linspace(0, 1, 16), indexing="ij")
    smooth = jnp.sin(2 * yy + xx)[None, None, :, :, None]
    coarse = downsample(smooth, (1, 2))
    up = upsample(coarse, (1, 16, 16), spatial=method)
    assert up.shape == smooth.shape
    err = float(jnp.sqrt(jnp.mean((up - smooth) ** 2)))
    assert err < 0.05, err
    with pytest.raises(ValueError, match="nested frames"):
        upsample(jnp.zeros((1, 4, 2, 2, 1)), (9, 2, 2))


def test_renoise_has_the_flow_marginal_on_a_gaussian_toy():
    """Data x0 ~ N(mu, s^2) on a coarse grid; after upsampling (nearest, exact for the toy's
    block-constant x0) and re-noising at sigma', every element must follow the flow marginal
    N((1 - sigma') mu, (1 - sigma')^2 s^2 + sigma'^2), with the re-noise independent of x0."""
    mu, s, sigma = 1.5, 0.7, 0.6
    k0, k1 = jax.random.split(jax.random.key(0))
    x0 = mu + s * jax.random.normal(k0, (4096, 3, 2, 2, 1), jnp.float32)
    full_noise = jax.random.normal(k1, (4096, 5, 4, 4, 1), jnp.float32)
    up = upsample(x0, (5, 4, 4), temporal="nearest", spatial="nearest")
    out = np.asarray(renoise(up, full_noise, sigma), np.float64)
    assert abs(out.mean() - (1 - sigma) * mu) < 0.01
    assert abs(out.var() - ((1 - sigma) ** 2 * s**2 + sigma**2)) < 0.01
    # Conditional on x0: mean (1 - sigma') x0, variance sigma'^2.
    resid = out - (1 - sigma) * np.asarray(up, np.float64)
    assert abs(resid.mean()) < 0.01 and abs(resid.var() - sigma**2) < 0.01


def test_reduced_positions_sit_at_block_centres_of_the_full_grid():
    patch = (1, 2, 2)
    full_tokens = np.asarray(video_positions(5, 4, 4))  # latent 5x8x8
    # Each reduced token (factors (2, 2), latent 3x4x4 -> tokens 3x2x2) covers full frames
    # {0, 2, 4} and a 2x2 block of full tokens; its position is that block's centre.
    pos = np.asarray(positions((3, 2, 2), (2, 2), patch)).reshape(3, 2, 2, 3)
    grid = full_tokens.reshape(5, 4, 4, 3)
    for i in range(3):
        for j in range(2):
            for k in range(2):
                block = grid[2 * i, 2 * j : 2 * j + 2, 2 * k : 2 * k + 2].reshape(-1, 3)
                np.testing.assert_allclose(pos[i, j, k], block.mean(0))
    np.testing.assert_array_equal(positions((5, 4, 4), (1, 1), patch), full_tokens)
