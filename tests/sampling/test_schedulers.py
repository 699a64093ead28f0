"""Solver schedules, exactness on straight flows, restarts and validation (no torch needed)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.sampling import SOLVERS, FlowEuler, UniPC, make_solver, shift_sigmas

SOLVER_CONFIGS = [
    FlowEuler(num_steps=6, shift=3.0),
    UniPC(num_steps=6, shift=3.0, order=1),
    UniPC(num_steps=6, shift=3.0, order=2),
    UniPC(num_steps=6, shift=3.0, order=3),
    UniPC(num_steps=6, shift=3.0, order=2, solver_type="bh1"),
]
IDS = ["euler", "unipc1", "unipc2", "unipc3", "unipc2-bh1"]
# One latent shape for every test: eager JAX compiles each op once per shape.
SHAPE = (1, 2, 2, 2, 4)


def _key(seed):
    return jax.random.key(seed)


@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize("num_steps", [1, 2, 7])
def test_schedule_shapes(name, num_steps):
    solver = make_solver(name, num_steps, 5.0)
    sigmas, timesteps = solver.sigmas, solver.timesteps
    assert sigmas.dtype == np.float32 and sigmas.shape == (num_steps + 1,)
    assert timesteps.dtype == np.float32 and timesteps.shape == (num_steps,)
    assert sigmas[-1] == 0 and 0.99 < sigmas[0] <= 1
    assert np.all(np.diff(sigmas) < 0)
    np.testing.assert_allclose(timesteps, 1000 * sigmas[:-1], atol=1.0)
    with pytest.raises(ValueError, match="read-only"):
        sigmas[0] = 0.5


def test_shift_sigmas():
    sigma = np.linspace(0.0, 1.0, 11)
    np.testing.assert_array_equal(shift_sigmas(sigma, 1.0), sigma)
    shifted = shift_sigmas(sigma, 5.0)
    assert shifted[0] == 0 and shifted[-1] == 1
    assert np.all(shifted[1:-1] > sigma[1:-1])  # s > 1 moves every level toward noise
    # Shifts compose multiplicatively; 1/s undoes s.
    np.testing.assert_allclose(shift_sigmas(shifted, 0.2), sigma, atol=1e-12)
    np.testing.assert_allclose(
        shift_sigmas(shift_sigmas(sigma, 2.0), 3.0), shift_sigmas(sigma, 6.0), atol=1e-12
    )
    got = shift_sigmas(jnp.asarray(sigma, jnp.float32), 5.0)
    np.testing.assert_allclose(got, shifted, rtol=1e-6)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="shift"):
            shift_sigmas(sigma, bad)


@pytest.mark.parametrize("solver", SOLVER_CONFIGS, ids=IDS)
def test_straight_flow_lands_on_x0(solver):
    """On x_σ = (1−σ)x₀ + σε the exact velocity is ε − x₀ everywhere; every solver is exact."""
    x0 = jax.random.normal(_key(0), SHAPE, jnp.float32)
    eps = jax.random.normal(_key(1), x0.shape, jnp.float32)
    sigma0 = float(solver.sigmas[0])
    x = (1 - sigma0) * x0 + sigma0 * eps
    state = solver.init(x)
    for i in range(solver.num_steps):
        x, state = solver.step(state, i, x, eps - x0)
        sigma = float(solver.sigmas[i + 1])
        np.testing.assert_allclose(x, (1 - sigma) * x0 + sigma * eps, atol=2e-5)
    np.testing.assert_allclose(x, x0, atol=2e-5)


@pytest.mark.parametrize("solver", [SOLVER_CONFIGS[0], SOLVER_CONFIGS[3]], ids=["euler", "unipc3"])
def test_traced_step_index_matches_python_index(solver):
    x = jax.random.normal(_key(2), SHAPE, jnp.float32)
    step = jax.jit(solver.step)
    state_py = state_jit = solver.init(x)
    x_py = x_jit = x
    for i in range(solver.num_steps):
        v = jnp.sin(3.0 * x_py) + 0.1 * i
        x_py, state_py = solver.step(state_py, i, x_py, v)
        x_jit, state_jit = step(state_jit, jnp.int32(i), x_jit, v)
        np.testing.assert_allclose(x_jit, x_py, rtol=1e-6, atol=1e-6)
        x_jit = x_py


def test_unipc_order_two_beats_euler_on_a_curved_flow():
    """A nonlinear ODE: higher order must be more accurate at the same step count."""
    # dx/dσ = v(x, σ) = x·σ has the solution x(σ) = x(1)·exp((σ² − 1)/2).
    x1 = jnp.linspace(-2.0, 2.0, 32, dtype=jnp.float32).reshape(SHAPE)
    errors = {}
    for name, solver in {
        "euler": FlowEuler(num_steps=8),
        "unipc1": UniPC(num_steps=8, order=1),
        "unipc2": UniPC(num_steps=8, order=2),
    }.items():
        sigmas = solver.sigmas
        x = x1 * np.float32(np.exp((sigmas[0] ** 2 - 1) / 2))
        state = solver.init(x)
        for i in range(solver.num_steps):
            x, state = solver.step(state, i, x, x * sigmas[i])
        errors[name] = float(jnp.max(jnp.abs(x - x1 * np.float32(np.exp(-0.5)))))
    assert errors["unipc2"] < errors["euler"] / 3, errors
    assert errors["unipc2"] < errors["unipc1"], errors


@pytest.mark.parametrize("order", [1, 2, 3])
def test_fresh_state_mid_schedule_equals_the_truncated_schedule(order):
    """`init` at step k restarts the solver: same as a solver built on sigmas[k:] from step 0."""
    full = UniPC(num_steps=9, shift=4.0, order=order)
    k = 4
    tail = UniPC.from_sigmas(full.sigmas[k:], order=order)
    np.testing.assert_array_equal(tail.sigmas, full.sigmas[k:])
    x = jax.random.normal(_key(3), SHAPE, jnp.float32)
    a, b = x, x
    state_a, state_b = full.init(a), tail.init(b)
    for j in range(tail.num_steps):
        a, state_a = full.step(state_a, k + j, a, jnp.cos(a))
        b, state_b = tail.step(state_b, j, b, jnp.cos(b))
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_from_sigmas_uses_the_schedule():
    sigmas = np.array([0.8, 0.5, 0.2, 0.0])
    euler = FlowEuler.from_sigmas(sigmas)
    assert euler.num_steps == 3
    np.testing.assert_array_equal(euler.sigmas, sigmas.astype(np.float32))
    np.testing.assert_allclose(euler.timesteps, [800, 500, 200], rtol=1e-6)
    unipc = UniPC.from_sigmas(sigmas, order=3)
    np.testing.assert_array_equal(unipc.sigmas, sigmas.astype(np.float32))
    np.testing.assert_array_equal(unipc.timesteps, [800, 500, 200])
    # A leading σ = 1 is lowered like diffusers' (log α would be −∞).
    assert UniPC.from_sigmas([1.0, 0.5, 0.0]).sigmas[0] == np.float32(1 - 1e-6)


def test_solvers_are_hashable_values():
    """The pipeline caches compiled loops keyed by solver."""
    a, b = make_solver("unipc", 10, 3.0), UniPC(num_steps=10, shift=3.0)
    assert a == b and hash(a) == hash(b)
    assert a != dataclasses.replace(b, order=3)
    assert hash(FlowEuler.from_sigmas([0.9, 0.1, 0.0])) == hash(
        FlowEuler.from_sigmas([0.9, 0.1, 0.0])
    )
    assert make_solver("unipc", 10, 3.0, order=1).order == 1


@pytest.mark.parametrize(
    "build",
    [
        lambda: FlowEuler(num_steps=0),
        lambda: FlowEuler(num_steps=-2),
        lambda: FlowEuler(num_steps=2.5),
        lambda: FlowEuler(num_steps=True),
        lambda: FlowEuler(num_steps=4, shift=0.0),
        lambda: FlowEuler(num_steps=4, shift=-3.0),
        lambda: FlowEuler(num_steps=4, shift=float("nan")),
        lambda: UniPC(num_steps=4, shift=float("inf")),
        lambda: UniPC(num_steps=4, order=0),
        lambda: UniPC(num_steps=4, order=4),
        lambda: UniPC(num_steps=4, solver_type="bh3"),
        lambda: UniPC(num_steps=4, lower_order_final="yes"),
        lambda: UniPC(num_steps=4, order=2, lower_order_final=False),
        lambda: FlowEuler.from_sigmas([0.5, 0.6, 0.0]),
        lambda: FlowEuler.from_sigmas([0.5, 0.5, 0.0]),
        lambda: FlowEuler.from_sigmas([1.5, 0.5, 0.0]),
        lambda: FlowEuler.from_sigmas([0.5, 0.2, -0.1]),
        lambda: FlowEuler.from_sigmas([0.5]),
        lambda: UniPC.from_sigmas([[0.5, 0.0]]),
        lambda: FlowEuler(num_steps=3, schedule=(0.9, 0.5, 0.0)),
        lambda: FlowEuler(num_steps=2, shift=3.0, schedule=(0.9, 0.5, 0.0)),
        lambda: make_solver("heun", 10, 3.0),
    ],
)
def test_invalid_configs_raise(build):
    with pytest.raises(ValueError):
        build()


def test_lower_order_final_false_is_fine_at_first_order():
    solver = UniPC(num_steps=4, order=1, lower_order_final=False)
    x = jnp.ones(SHAPE, jnp.float32)
    state = solver.init(x)
    for i in range(4):
        x, state = solver.step(state, i, x, x)
    assert bool(jnp.all(jnp.isfinite(x)))


def test_unknown_solver_message_lists_choices():
    with pytest.raises(ValueError, match=r"euler.*unipc"):
        make_solver("dpm", 4, 1.0)


def test_low_precision_latents_keep_their_dtype():
    solver = UniPC(num_steps=4, shift=3.0)
    x32 = jax.random.normal(_key(4), SHAPE, jnp.float32)
    x16 = x32.astype(jnp.bfloat16)
    state32, state16 = solver.init(x32), solver.init(x16)
    assert state16.history.dtype == jnp.float32
    for i in range(4):
        x32, state32 = solver.step(state32, i, x32, jnp.tanh(x32))
        x16, state16 = solver.step(state16, i, x16, jnp.tanh(x16))
        assert x16.dtype == jnp.bfloat16
    np.testing.assert_allclose(x16.astype(jnp.float32), x32, atol=0.05)
