"""The step cache: a skipped step reuses the previous velocity and runs no model forward; no
skips is the plain loop bit for bit; the plan follows its rules."""

import itertools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax import sampling
from vidax.sampling import step_cache

N = 8


def _velocity(calls=None):
    def velocity(x, t):
        if calls is not None:
            jax.debug.callback(lambda: calls.append(1))
        return jnp.sin(x * (1.0 + t / 1000.0)) - 0.5 * x

    return velocity


@pytest.mark.parametrize("name", ["euler", "unipc"])
def test_no_skips_is_the_plain_loop_bit_for_bit(name):
    solver = sampling.make_solver(name, N, 3.0)
    x = jax.random.normal(jax.random.key(0), (1, 2, 4, 4, 3))
    run = lambda skip: jax.jit(
        lambda x: step_cache.cached_steps(
            _velocity(), x, solver, solver.init(x), skip, start=0, stop=N
        )[0]
    )(x)
    plain = jax.jit(lambda x: sampling.sample(_velocity(), x, solver))(x)
    np.testing.assert_array_equal(run((False,) * N), plain)


def test_a_skipped_step_reuses_the_last_velocity_and_runs_no_forward():
    solver = sampling.make_solver("euler", N, 3.0)
    x0 = jax.random.normal(jax.random.key(1), (1, 2, 4, 4, 3))
    skip = (False, False, False, True, False, True, False, False)
    calls: list = []
    got, _, changes = jax.jit(
        lambda x: step_cache.cached_steps(
            _velocity(calls), x, solver, solver.init(x), skip, start=0, stop=N
        )
    )(x0)
    jax.effects_barrier()
    assert len(calls) == N - sum(skip)  # the skipped forwards never ran

    # The same trajectory by hand: at a skipped step, the linear forecast from the last two.
    x, state, history = x0, solver.init(x0), []
    want_errors = []
    for i in range(N):
        t = float(solver.timesteps[i])
        forecast = None
        if history:
            (v1, t1), (v0, t0) = history[-1], history[-2] if len(history) > 1 else history[-1]
            forecast = v1 + ((v1 - v0) / (t1 - t0) if t1 != t0 else 0) * (t - t1)
        if skip[i]:
            v = forecast
            want_errors.append(np.nan)
        else:
            v = _velocity()(x, jnp.float32(t))
            want_errors.append(
                np.nan
                if forecast is None
                else float(jnp.mean(jnp.abs(v - forecast)) / jnp.mean(jnp.abs(forecast)))
            )
            history.append((v, t))
        x, state = solver.step(state, i, x, v)
    np.testing.assert_allclose(got, x, atol=1e-5)
    np.testing.assert_allclose(np.asarray(changes), want_errors, rtol=1e-4)


def test_sample_steps_takes_a_skip_list():
    solver = sampling.make_solver("euler", N, 3.0)
    x = jax.random.normal(jax.random.key(2), (1, 2, 4, 4, 3))
    skip = (False, False, True, False, False, False, False, False)
    cached = step_cache.cached_steps(_velocity(), x, solver, solver.init(x), skip, start=0, stop=N)
    x1, _ = sampling.sample_steps(
        _velocity(), x, solver, solver.init(x), start=0, stop=N, skip=skip
    )
    np.testing.assert_array_equal(x1, cached[0])
    assert not np.allclose(x1, sampling.sample(_velocity(), x, solver))


def test_a_segment_computes_its_first_step():
    # Nothing to reuse yet at a segment's start (DVG stages start mid-schedule).
    solver = sampling.make_solver("euler", N, 3.0)
    x = jax.random.normal(jax.random.key(3), (1, 2, 4, 4, 3))
    skip = (False, False, False, True, False, False, False, False)
    calls: list = []
    step_cache.cached_steps(_velocity(calls), x, solver, solver.init(x), skip, start=3, stop=6)
    jax.effects_barrier()
    assert len(calls) == 3


def test_plan_keeps_its_fraction_and_its_rules():
    rng = np.random.default_rng(0)
    for n in (8, 20, 50):
        changes = rng.uniform(0.01, 1.0, n)
        for keep in (0.5, 0.6, 0.8, 1.0):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # keep 0.5 asks for more than the rules allow
                skip = step_cache.plan_skips(changes, keep)
            assert len(skip) == n and sum(skip) <= n - math.ceil(keep * n)
            assert not any(skip[: math.ceil(step_cache.WARMUP * n)]) and not skip[-1]
            assert not any(a and b for a, b in itertools.pairwise(skip))
    # The least-changing steps go first.
    changes = np.array([np.nan, 1, 1, 1, 0.01, 1, 1, 1, 0.02, 1])
    assert [i for i, s in enumerate(step_cache.plan_skips(changes, 0.8)) if s] == [4, 8]
    assert not any(step_cache.plan_skips(changes, 1.0))
    with pytest.warns(UserWarning, match="skips at most 4"):
        assert sum(step_cache.plan_skips(changes, 0.2)) == 4
    with pytest.raises(ValueError, match="keep must be in"):
        step_cache.plan_skips(changes, 0.0)


def test_uniform_skips_is_the_rules_plan_at_the_stated_rate():
    """Equal changes everywhere: the rules alone place the skips (the FLOP table's and the
    device suite's stated plan, 12 of 30 and 20 of 50 at the default keep)."""
    for n, skipped in ((30, 12), (50, 20)):
        skip = step_cache.uniform_skips(n)
        assert len(skip) == n and sum(skip) == skipped
        assert not any(skip[: math.ceil(step_cache.WARMUP * n)]) and not skip[-1]
        assert not any(a and b for a, b in itertools.pairwise(skip))
    assert not any(step_cache.uniform_skips(20, keep=1.0))
