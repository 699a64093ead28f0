"""End to end on a Gaussian-field toy whose exact denoiser is known at every grid.

Data: a stationary Gaussian video field (a pattern translating at `speed` pixels per frame).
The exact velocity on a grid uses the covariance of the data restricted to that grid, so the
full-resolution ODE and every DVG schedule can be compared without a trained model.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax import dvg, sampling

LATENT = (5, 8, 8)


def _covariance(speed: float, length: float) -> np.ndarray:
    t, y, x = np.meshgrid(*(np.arange(n) for n in LATENT), indexing="ij")
    p = np.stack([t.ravel(), y.ravel(), x.ravel()], 1).astype(np.float64)
    d = p[:, None] - p[None]
    return np.exp(-((d[..., 2] - speed * d[..., 0]) ** 2 + d[..., 1] ** 2) / (2 * length**2))


class ExactDenoiser:
    """v(x, t) = (x - E[x0 | x]) / sigma for the field restricted to x's grid."""

    def __init__(self, cov: np.ndarray, spatial: str = "dct"):
        self.cov, self.spatial, self.bases = cov, spatial, {}

    def _basis(self, grid):
        if grid not in self.bases:
            t, h, _ = LATENT
            ft = 1 if grid[0] == t else (t - 1) // (grid[0] - 1)
            fs = h // grid[1]
            ops = [
                dvg.axis_operators(t, ft, "time", "linear"),
                dvg.axis_operators(h, fs, "space", self.spatial),
                dvg.axis_operators(h, fs, "space", self.spatial),
            ]
            d = np.kron(ops[0].data, np.kron(ops[1].data, ops[2].data))
            lam, u = np.linalg.eigh(d @ self.cov @ d.T)
            self.bases[grid] = (np.maximum(lam, 0).astype(np.float32), u.astype(np.float32))
        return self.bases[grid]

    def __call__(self, x, t, positions=None):
        lam, u = self._basis(tuple(x.shape[1:4]))
        sigma = t / 1000.0
        flat = x.reshape(x.shape[0], -1)
        gain = (1 - sigma) * lam / ((1 - sigma) ** 2 * lam + sigma**2)
        x0 = ((flat @ u) * gain[None]) @ u.T
        return ((flat - x0) / sigma).reshape(x.shape)


def _psnr(x, ref):
    return float(10 * np.log10(np.max(np.abs(ref)) ** 2 / np.mean((x - ref) ** 2)))


SOLVER = sampling.FlowEuler(num_steps=10, shift=3.0)


@pytest.fixture(scope="module")
def noise():
    return jax.random.normal(jax.random.key(0), (64, *LATENT, 1), jnp.float32)


def _run(denoiser, start, schedule, **options):
    p = dvg.plan(dvg.Schedule.of(schedule), LATENT, (1, 1, 1), SOLVER, **options)
    return np.asarray(jax.jit(lambda n: dvg.sample(denoiser, n, p, key=jax.random.key(1)))(start))


def test_consistent_transitions_track_the_full_resolution_ode(noise):
    denoiser = ExactDenoiser(_covariance(speed=0.5, length=2.0))
    full = np.asarray(
        jax.jit(lambda n: sampling.sample(lambda x, t: denoiser(x, t), n, SOLVER))(noise)
    )
    schedule = [(2, 2, 4), (1, 2, 3), (1, 1, 3)]
    psnr = {
        mode: _psnr(_run(denoiser, noise, schedule, noise=mode), full)
        for mode in ("consistent", "initial", "fresh")
    }
    assert psnr["consistent"] > 30.0
    assert psnr["consistent"] > psnr["initial"] + 3 > psnr["fresh"] + 3


def test_samples_keep_the_full_samplers_variance(noise):
    """Over seeds, the outputs' per-element variance matches the full-resolution sampler's (10
    Euler steps lose some variance themselves): consistent transitions neither add nor remove
    energy, while re-noising with the restricted starting noise adds some and fresh noise
    removes some."""
    denoiser = ExactDenoiser(_covariance(speed=0.0, length=1.5))
    full = np.asarray(
        jax.jit(lambda n: sampling.sample(lambda x, t: denoiser(x, t), n, SOLVER))(noise)
    )
    want = float(full.var(axis=0).mean())
    schedule = [(2, 2, 6), (1, 1, 4)]
    var = {
        mode: float(_run(denoiser, noise, schedule, noise=mode).var(axis=0).mean())
        for mode in ("consistent", "initial", "fresh")
    }
    assert abs(var["consistent"] - want) < 0.05
    assert var["initial"] > want + 0.1 and var["fresh"] < want - 0.1


def test_static_fields_prefer_temporal_reduction_moving_fields_spatial(noise):
    """What the selector's loss model encodes: at similar token cost, dropping frames is
    nearly free for a still scene and costly for a moving one, and vice versa for detail."""
    temporal, spatial = [(4, 1, 6), (1, 1, 4)], [(1, 2, 6), (1, 1, 4)]
    results = {}
    for name, speed, length in [("still", 0.0, 1.0), ("moving", 2.0, 3.0)]:
        denoiser = ExactDenoiser(_covariance(speed=speed, length=length))
        full = np.asarray(
            jax.jit(lambda n, d=denoiser: sampling.sample(lambda x, t: d(x, t), n, SOLVER))(noise)
        )
        results[name] = {
            label: _psnr(_run(denoiser, noise, sched), full)
            for label, sched in (("temporal", temporal), ("spatial", spatial))
        }
    assert results["still"]["temporal"] > results["still"]["spatial"]
    assert results["moving"]["spatial"] > results["moving"]["temporal"]
