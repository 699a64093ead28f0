"""The jitted loop, segment composition, progress callbacks and classifier-free guidance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.sampling import (
    FlowEuler,
    UniPC,
    classifier_free_guidance,
    make_solver,
    predict_x0,
    renoise,
    sample,
    sample_steps,
)

SHAPE = (2, 2, 2, 2, 4)
SOLVERS = [FlowEuler(num_steps=5, shift=3.0), UniPC(num_steps=5, shift=3.0, order=3)]
IDS = ["euler", "unipc3"]


def _velocity(x, t):
    """A nonlinear, timestep-dependent stand-in for a model."""
    return jnp.sin(2.0 * x) + (t / 1000.0) * x


def _noise(seed=0):
    return jax.random.normal(jax.random.key(seed), SHAPE, jnp.float32)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_jitted_sample_equals_python_loop_of_steps(solver):
    x = _noise()
    got = jax.jit(lambda x: sample(_velocity, x, solver))(x)
    want, state = x, solver.init(x)
    for i in range(solver.num_steps):
        v = _velocity(want, jnp.float32(solver.timesteps[i]))
        want, state = solver.step(state, i, want, v)
    assert got.shape == x.shape and got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(got - x))) > 0.1  # the loop really ran


def test_velocity_fn_sees_each_timestep_in_order():
    solver = UniPC(num_steps=4, shift=5.0)
    seen = []

    def velocity(x, t):
        assert t.shape == () and t.dtype == jnp.float32
        jax.debug.callback(lambda t: seen.append(float(t)), t)
        return -x

    jax.block_until_ready(jax.jit(lambda x: sample(velocity, x, solver))(_noise()))
    jax.effects_barrier()
    np.testing.assert_array_equal(seen, solver.timesteps)


@pytest.mark.parametrize("solver", SOLVERS, ids=IDS)
def test_segments_compose_when_the_state_is_carried(solver):
    x = _noise(1)
    run = jax.jit(lambda x: sample(_velocity, x, solver))
    whole = run(x)
    k = 2
    mid, state = sample_steps(_velocity, x, solver, solver.init(x), start=0, stop=k)
    end, _ = sample_steps(_velocity, mid, solver, state, start=k, stop=solver.num_steps)
    np.testing.assert_allclose(end, whole, rtol=1e-5, atol=1e-5)


def test_euler_segments_compose_with_sample():
    solver = SOLVERS[0]
    x = _noise(2)
    whole = sample(_velocity, x, solver)
    end = sample(_velocity, sample(_velocity, x, solver, stop=3), solver, start=3)
    np.testing.assert_allclose(end, whole, rtol=1e-5, atol=1e-5)


def test_unipc_sample_from_start_restarts_the_history():
    """`sample(start=k)` begins with a fresh state, unlike carrying the state across."""
    solver = SOLVERS[1]
    x = _noise(3)
    mid, state = sample_steps(_velocity, x, solver, solver.init(x), start=0, stop=2)
    carried, _ = sample_steps(_velocity, mid, solver, state, start=2, stop=5)
    restarted = sample(_velocity, mid, solver, start=2)
    fresh, _ = sample_steps(_velocity, mid, solver, solver.init(mid), start=2, stop=5)
    np.testing.assert_array_equal(restarted, fresh)
    assert float(jnp.max(jnp.abs(restarted - carried))) > 1e-4


def test_empty_range_and_bad_ranges():
    solver = SOLVERS[0]
    x = _noise()
    np.testing.assert_array_equal(sample(_velocity, x, solver, start=3, stop=3), x)
    for start, stop in [(-1, 2), (3, 2), (0, 6)]:
        with pytest.raises(ValueError, match="start"):
            sample(_velocity, x, solver, start=start, stop=stop)


def test_velocity_of_the_wrong_shape_raises():
    with pytest.raises(ValueError, match="shape"):
        sample(lambda x, t: x[:1], _noise(), SOLVERS[0])


def test_on_step_reports_every_step_in_order():
    calls = []
    solver = make_solver("unipc", 6, 3.0)
    run = jax.jit(lambda x: sample(_velocity, x, solver, start=1, on_step=calls.append))
    jax.block_until_ready(run(_noise()))
    jax.effects_barrier()
    assert calls == [1, 2, 3, 4, 5]
    assert all(type(i) is int for i in calls)


def test_predict_x0_and_renoise_invert_each_other():
    x0, eps = _noise(4), _noise(5)
    sigma = jnp.array([0.3, 0.8], jnp.float32).reshape(2, 1, 1, 1, 1)  # per-sample levels
    x = renoise(x0, eps, sigma)
    np.testing.assert_allclose(x[0], 0.7 * x0[0] + 0.3 * eps[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x[1], 0.2 * x0[1] + 0.8 * eps[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(predict_x0(x, sigma, eps - x0), x0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(renoise(x0, eps, 0.0), x0)
    np.testing.assert_array_equal(renoise(x0, eps, 1.0), eps)
    assert renoise(x0.astype(jnp.bfloat16), eps, 0.5).dtype == jnp.bfloat16


# -- classifier-free guidance ---------------------------------------------------------------------


class _CountingModel:
    """model_fn(x, t, context) -> v, recording every call's batch size."""

    def __init__(self):
        self.batches = []

    def __call__(self, x, t, context):
        self.batches.append(x.shape[0])
        assert t.shape == (x.shape[0],) and t.dtype == jnp.float32
        c = context["text"].mean(axis=(1, 2)) + context["pooled"][:, 0]
        return jnp.tanh(x) * c[:, None, None, None, None] + (t / 1000.0)[:, None, None, None, None]


def _contexts():
    keys = jax.random.split(jax.random.key(7), 4)
    context = {
        "text": jax.random.normal(keys[0], (2, 3, 6)),
        "pooled": jax.random.normal(keys[1], (2, 6)),
    }
    negative = {
        "text": jax.random.normal(keys[2], (2, 3, 6)),
        "pooled": jax.random.normal(keys[3], (2, 6)),
    }
    return context, negative


@pytest.mark.parametrize("scale", [5.0, 0.0, -2.0])
def test_cfg_is_one_batched_forward_combining_both_branches(scale):
    model = _CountingModel()
    context, negative = _contexts()
    velocity = classifier_free_guidance(model, context, negative, scale)
    x, t = _noise(), jnp.float32(640.0)
    got = velocity(x, t)
    assert model.batches == [2 * SHAPE[0]]
    tb = jnp.full((SHAPE[0],), t)
    cond, uncond = model(x, tb, context), model(x, tb, negative)
    np.testing.assert_allclose(got, uncond + scale * (cond - uncond), rtol=1e-5, atol=1e-5)


def test_cfg_inside_the_jitted_loop_traces_one_forward_per_step():
    model = _CountingModel()
    context, negative = _contexts()
    velocity = classifier_free_guidance(model, context, negative, 4.0)
    solver = UniPC(num_steps=6, shift=3.0)
    jax.jit(lambda x: sample(velocity, x, solver))(_noise())
    assert model.batches == [2 * SHAPE[0]]  # the fori_loop body is traced once


def test_cfg_scale_can_be_traced():
    model = _CountingModel()
    context, negative = _contexts()
    x, t = _noise(), jnp.float32(300.0)

    @jax.jit
    def guided(scale):
        return classifier_free_guidance(model, context, negative, scale)(x, t)

    want = classifier_free_guidance(model, context, negative, 3.0)(x, t)
    np.testing.assert_allclose(guided(jnp.float32(3.0)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale,negative", [(1.0, True), (1, True), (6.0, False)])
def test_cfg_without_guidance_is_a_single_unbatched_forward(scale, negative):
    model = _CountingModel()
    context, neg = _contexts()
    velocity = classifier_free_guidance(model, context, neg if negative else None, scale)
    x, t = _noise(), jnp.float32(100.0)
    got = velocity(x, t)
    assert model.batches == [SHAPE[0]]
    np.testing.assert_array_equal(got, model(x, jnp.full((SHAPE[0],), t), context))


def test_cfg_rejects_mismatched_contexts():
    context, negative = _contexts()
    with pytest.raises(ValueError, match="structure"):
        classifier_free_guidance(_CountingModel(), context, {"text": negative["text"]}, 5.0)
