"""Transition math: grid operators, noise restriction and correction, upsampling, re-noising
and RoPE positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.dvg import (
    SPATIAL_METHODS,
    axis_operators,
    correct_noise,
    downsample,
    positions,
    renoise,
    restrict_noise,
    upsample,
)
from vidax.nn import video_positions

LATENT = (9, 16, 16)


@pytest.mark.parametrize("method", SPATIAL_METHODS)
@pytest.mark.parametrize("factor", [2, 4])
def test_spatial_operators(method, factor):
    ops = axis_operators(16, factor, "space", method)
    m = 16 // factor
    assert ops.data.shape == ops.noise.shape == (m, 16) and ops.prolong.shape == (16, m)
    np.testing.assert_allclose(ops.noise @ ops.noise.T, np.eye(m), atol=1e-12)  # white stays white
    np.testing.assert_allclose(ops.noise, ops.data * np.sqrt(factor), atol=1e-12)
    # constants survive restriction and prolongation (amplitude-preserving)
    np.testing.assert_allclose(ops.data @ np.ones(16), np.ones(m), atol=1e-12)
    np.testing.assert_allclose(ops.prolong @ np.ones(m), np.ones(16), atol=1e-6)
    if method in ("dct", "nearest"):  # exact round trip of coarse signals
        np.testing.assert_allclose(ops.data @ ops.prolong, np.eye(m), atol=1e-12)
    with pytest.raises(ValueError, match="spatial method"):
        axis_operators(16, factor, "space", "bogus")


@pytest.mark.parametrize("method", ["linear", "nearest"])
def test_temporal_operators_keep_nested_frames(method):
    ops = axis_operators(9, 2, "time", method)
    np.testing.assert_array_equal(ops.data, np.eye(9)[::2])
    np.testing.assert_allclose(ops.noise @ ops.noise.T, np.eye(5), atol=1e-12)
    np.testing.assert_allclose(ops.data @ ops.prolong, np.eye(5), atol=1e-12)  # anchors exact
    if method == "linear":
        ramp = 1.0 + 3.0 * np.arange(5)
        np.testing.assert_allclose(ops.prolong @ ramp, 1.0 + 1.5 * np.arange(9))


def test_restricted_noise_is_white_with_unit_variance():
    noise = jax.random.normal(jax.random.key(0), (16, *LATENT, 4), jnp.float32)
    for factors, spatial in [((2, 2), "dct"), ((4, 4), "cubic"), ((1, 8), "dct"), ((8, 1), "dct")]:
        x = np.asarray(restrict_noise(noise, factors, spatial=spatial), np.float64)
        t = (LATENT[0] - 1) // factors[0] + 1
        assert x.shape == (16, t, 16 // factors[1], 16 // factors[1], 4)
        assert abs(x.mean()) < 0.03 and abs(x.var() - 1) < 0.05
        assert abs(np.mean(x[:, :, 1:] * x[:, :, :-1])) < 0.05  # neighbours uncorrelated


def test_corrected_noise_restricts_to_the_prediction_and_keeps_the_complement():
    k0, k1 = jax.random.split(jax.random.key(1))
    noise = jax.random.normal(k0, (2, *LATENT, 3), jnp.float32)
    factors = (2, 2)
    predicted = 0.5 * jax.random.normal(k1, (2, 5, 8, 8, 3), jnp.float32)
    out = correct_noise(noise, predicted, factors)
    np.testing.assert_allclose(restrict_noise(out, factors), predicted, atol=1e-5)
    # the complement (what the coarse grid cannot represent) is untouched
    diff = out - noise
    np.testing.assert_allclose(
        diff,
        correct_noise(jnp.zeros_like(noise), predicted - restrict_noise(noise, factors), factors),
        atol=1e-5,
    )


def test_upsample_between_nested_grids():
    t = jnp.arange(5, dtype=jnp.float32)
    x = jnp.broadcast_to(3.0 * t[None, :, None, None, None] + 1.0, (1, 5, 4, 4, 1))
    up = upsample(x, LATENT, (2, 4), (1, 1))
    assert up.shape == (1, 9, 16, 16, 1)
    np.testing.assert_allclose(up[0, :, 5, 7, 0], 1.0 + 1.5 * np.arange(9), rtol=1e-5)
    mid = upsample(x, LATENT, (2, 4), (2, 2))
    assert mid.shape == (1, 5, 8, 8, 1)
    np.testing.assert_allclose(downsample(up, (2, 2)), mid, atol=1e-5)  # nested DCT grids
    with pytest.raises(ValueError, match="not nested"):
        upsample(x, LATENT, (2, 4), (4, 1))
    with pytest.raises(ValueError, match="expected"):
        upsample(x, LATENT, (2, 2), (1, 1))


@pytest.mark.parametrize("method", ["dct", "cubic"])
def test_smooth_content_survives_a_round_trip(method):
    yy, xx = jnp.meshgrid(jnp.linspace(0, 1, 16), jnp.linspace(0, 1, 16), indexing="ij")
    smooth = jnp.broadcast_to(jnp.sin(2 * yy + xx)[None, None, :, :, None], (1, 9, 16, 16, 1))
    coarse = downsample(smooth, (1, 2), spatial=method)
    up = upsample(coarse, LATENT, (1, 2), spatial=method)
    assert float(jnp.sqrt(jnp.mean((up - smooth) ** 2))) < 0.05


def test_renoise_has_the_flow_marginal_on_a_gaussian_toy():
    """Data x0 ~ N(mu, s^2) on a coarse grid; after upsampling (nearest, exact for the toy's
    block-constant x0) and re-noising at sigma' with restricted white noise, every element must
    follow the flow marginal N((1 - sigma') mu, (1 - sigma')^2 s^2 + sigma'^2), with the
    re-noise independent of x0."""
    mu, s, sigma = 1.5, 0.7, 0.6
    k0, k1 = jax.random.split(jax.random.key(0))
    x0 = mu + s * jax.random.normal(k0, (4096, 3, 4, 4, 1), jnp.float32)
    full_noise = jax.random.normal(k1, (4096, 5, 8, 8, 1), jnp.float32)
    up = upsample(x0, (5, 8, 8), (2, 2), (1, 1), temporal="nearest", spatial="nearest")
    out = np.asarray(renoise(up, full_noise, sigma), np.float64)
    assert abs(out.mean() - (1 - sigma) * mu) < 0.01
    assert abs(out.var() - ((1 - sigma) ** 2 * s**2 + sigma**2)) < 0.01
    resid = out - (1 - sigma) * np.asarray(up, np.float64)
    assert abs(resid.mean()) < 0.01 and abs(resid.var() - sigma**2) < 0.01


def test_reduced_positions_sit_at_block_centres_of_the_full_grid():
    patch = (1, 2, 2)
    full_tokens = np.asarray(video_positions(5, 4, 4))  # latent 5x8x8
    pos = positions((3, 2, 2), (2, 2), patch).reshape(3, 2, 2, 3)
    grid = full_tokens.reshape(5, 4, 4, 3)
    for i in range(3):
        for j in range(2):
            for k in range(2):
                block = grid[2 * i, 2 * j : 2 * j + 2, 2 * k : 2 * k + 2].reshape(-1, 3)
                np.testing.assert_allclose(pos[i, j, k], block.mean(0))
    np.testing.assert_array_equal(positions((5, 4, 4), (1, 1), patch), full_tokens)
