"""Optimiser schedule, EMA and flow-matching pieces."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.train.flow import SigmaSampler, noisy, shift_sigma, velocity_error, weighted_mean
from vidax.train.optim import OptimConfig, ema_decay_at, ema_update, learning_rate, make_optimizer


def test_learning_rate_warms_up_then_decays_to_the_floor():
    config = OptimConfig(lr=1e-3, warmup=10, decay_steps=100, min_lr_ratio=0.1)
    lr = learning_rate(config)
    np.testing.assert_allclose(float(lr(0)), 0.0)
    np.testing.assert_allclose(float(lr(5)), 5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(lr(10)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(lr(110)), 1e-4, rtol=1e-5)
    assert float(lr(60)) < 1e-3
    constant = learning_rate(OptimConfig(lr=2e-3, warmup=4))
    np.testing.assert_allclose(float(constant(1000)), 2e-3, rtol=1e-6)


def test_weight_decay_skips_vectors():
    config = OptimConfig(lr=1.0, warmup=0, weight_decay=0.5, grad_clip=0.0)
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    opt = make_optimizer(config)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zeros, opt.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.5)  # lr * wd * w
    np.testing.assert_allclose(np.asarray(updates["b"]), 0.0)


def test_ema_warms_up_and_averages():
    np.testing.assert_allclose(float(ema_decay_at(jnp.int32(0), 0.999)), 0.1)
    np.testing.assert_allclose(float(ema_decay_at(jnp.int32(10**6), 0.999)), 0.999)
    ema = {"a": jnp.zeros(3)}
    out = ema_update(ema, {"a": jnp.ones(3)}, jnp.int32(0), 0.999)
    np.testing.assert_allclose(np.asarray(out["a"]), 0.9, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [dict(lr=0.0), dict(warmup=-1), dict(b2=1.0), dict(ema_decay=1.0), dict(min_lr_ratio=2.0)],
)
def test_optim_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        OptimConfig(**kwargs)


def test_noisy_interpolates_data_and_noise():
    x0, eps = jnp.zeros((2, 3)), jnp.ones((2, 3))
    out = noisy(x0, eps, jnp.asarray([0.0, 0.25]))
    np.testing.assert_allclose(np.asarray(out), [[0, 0, 0], [0.25, 0.25, 0.25]])


def test_sigma_sampler_range_and_shift():
    key = jax.random.key(0)
    plain = SigmaSampler()(key, 4096)
    shifted = SigmaSampler(shift=3.0)(key, 4096)
    assert float(plain.min()) > 0 and float(plain.max()) < 1
    np.testing.assert_allclose(float(jnp.median(plain)), 0.5, atol=0.03)
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(shift_sigma(plain, 3.0)), rtol=1e-6)
    assert float(jnp.median(shifted)) > 0.7  # shift 3 maps 0.5 -> 0.75
    with pytest.raises(ValueError):
        SigmaSampler(std=0.0)


def _loss(model_fn, x0, eps, sigma):
    per = weighted_mean(velocity_error(model_fn, x0, eps, sigma))
    return jnp.mean(per), per


def test_velocity_error_is_zero_for_the_true_velocity():
    x0 = jax.random.normal(jax.random.key(1), (2, 3, 4, 4, 2))
    eps = jax.random.normal(jax.random.key(2), x0.shape)
    sigma = jnp.asarray([0.3, 0.8])
    exact = lambda x, t: eps - x0
    loss, per = _loss(exact, x0, eps, sigma)
    assert float(loss) == 0.0 and per.shape == (2,)
    seen = {}

    def zero(x, t):
        seen["t"] = t
        return jnp.zeros_like(x)

    loss, _ = _loss(zero, x0, eps, sigma)
    np.testing.assert_allclose(float(loss), float(jnp.mean((eps - x0) ** 2)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(seen["t"]), [300.0, 800.0], rtol=1e-6)
