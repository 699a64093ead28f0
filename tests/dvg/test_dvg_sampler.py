"""The progressive sampler: invariance with the base sampler, one compile per schedule, stage
shapes and positions, probe resumption, few-step schedules, mesh padding and sharding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax import dvg, pipeline
from vidax.dvg import sampler as dvg_sampler
from vidax.dvg import selector
from vidax.models.registry import get
from vidax.sampling import FlowEuler, UniPC
from vidax.sharding import make_mesh, param_shardings, use_mesh
from vidax.text import embed_prompts

LATENT = (5, 8, 8)
GUIDANCE = 4.0


@dataclasses.dataclass(frozen=True)
class _ToyConfig:
    patch_size: tuple = (1, 2, 2)


class ToyDiT(nnx.Module):
    """A cheap stand-in DiT (compiles in a blink) with the interface DVG needs: a `config` with
    a patch size, `model(x, timestep, context, positions=...)`."""

    def __init__(self, channels: int):
        self.config = _ToyConfig()
        self.w = nnx.Param(jnp.linspace(-0.5, 0.5, channels * channels).reshape(channels, -1))

    def __call__(self, x, timestep, context, *, positions=None):
        h = jnp.tanh(x @ self.w[...]) + context.mean() + timestep[:, None, None, None, None] / 1e3
        if positions is not None:  # depend on the geometry the sampler passes
            h = h + 1e-3 * positions[:, 0].mean()
        return h


@pytest.fixture(scope="module")
def toy(tiny):
    _, cond, negative, noise = tiny
    return ToyDiT(noise.shape[-1]), cond, negative, noise


@pytest.fixture(scope="module")
def tiny():
    spec = get("tiny")
    model = spec.build(seed=0)
    family = pipeline.Adapter.of(spec)
    cond = family.conditioning(embed_prompts(spec, ["a red circle"]), GUIDANCE)
    negative = family.conditioning(embed_prompts(spec, [""]), GUIDANCE)
    channels = spec.config.in_channels
    noise = jax.random.normal(jax.random.key(0), (1, *LATENT, channels), jnp.float32)
    return model, cond, negative, noise


@pytest.mark.parametrize(
    "solver",
    [
        # (the transitions are solver-independent; UniPC's multistep state is the harder case)
        pytest.param(FlowEuler(num_steps=4, shift=3.0), marks=pytest.mark.slow),
        UniPC(num_steps=4, shift=3.0),
    ],
    ids=str,
)
def test_strategy_none_equals_the_base_sampler(tiny, solver):
    model, cond, negative, noise = tiny
    base = pipeline.denoise(model, noise, cond, negative, solver=solver, guidance=GUIDANCE)
    p = dvg.plan(dvg.Schedule.full(4), LATENT, (1, 2, 2), solver)
    got = dvg.denoise(model, noise, cond, negative, plan=p, guidance=GUIDANCE)
    np.testing.assert_array_equal(got, base)
    got, choices = dvg.accelerate(
        model, noise, cond, negative, solver=solver, guidance=GUIDANCE, accel="none"
    )
    np.testing.assert_array_equal(got, base)
    assert choices[0].family == "none" and choices[0].cost == 1.0


def test_stages_see_their_grids_and_full_resolution_positions():
    """A toy velocity records what each stage passes; one trace covers the whole schedule."""
    solver = FlowEuler(num_steps=6, shift=3.0)
    schedule = dvg.Schedule.of([(2, 2, 2), (1, 2, 2), (1, 1, 2)])
    p = dvg.plan(schedule, LATENT, (1, 2, 2), solver)
    seen, traces = [], []

    def velocity(x, t, grid):
        seen.append((x.shape[1:4], None if grid is None else np.asarray(grid.positions)))
        return jnp.sin(x) + t / 1000.0

    @jax.jit
    def run(noise):
        traces.append(1)
        return dvg.sample(velocity, noise, p)

    noise = jax.random.normal(jax.random.key(1), (1, *LATENT, 4), jnp.float32)
    out = run(noise)
    run(noise + 1.0)
    assert len(traces) == 1  # compiled once; shapes change only at stage boundaries
    assert out.shape == noise.shape and bool(jnp.all(jnp.isfinite(out)))
    # (a reduced stage traces its step loop and its final clean-prediction evaluation)
    assert list(dict.fromkeys(s[0] for s in seen)) == [(3, 4, 4), (5, 4, 4), (5, 8, 8)]
    pos0 = seen[0][1].reshape(3, 2, 2, 3)
    np.testing.assert_allclose(pos0[:, 0, 0, 0], [0, 2, 4])  # frames 0, 2, 4 of the full grid
    np.testing.assert_allclose(pos0[0, :, 0, 1], [0.5, 2.5])  # 2x2 block centres
    assert seen[-1][1] is None  # full resolution: the model's default integer grid


def test_clean_data_is_reproduced_through_every_transition():
    """For data that is a single constant latent x*, the exact velocity (x - x*) / sigma makes
    every stage's clean prediction x*: the output must be x* for any schedule and upsampler."""
    target = jnp.asarray([0.5, -1.0, 2.0, 0.25], jnp.float32)

    def velocity(x, t, grid):
        del grid
        return (x - target.reshape(1, 1, 1, 1, -1)) / (t / 1000.0)

    noise = jax.random.normal(jax.random.key(2), (2, *LATENT, 4), jnp.float32)
    solver = FlowEuler(num_steps=5, shift=3.0)
    for schedule, spatial in [
        ([(4, 2, 2), (2, 1, 1), (1, 1, 2)], "cubic"),
        ([(1, 4, 3), (1, 1, 2)], "lanczos3"),
        ([(2, 1, 4), (1, 1, 1)], "nearest"),
    ]:
        p = dvg.plan(dvg.Schedule.of(schedule), LATENT, (1, 2, 2), solver, spatial=spatial)
        out = jax.jit(lambda n, p=p: dvg.sample(velocity, n, p))(noise)
        np.testing.assert_allclose(out, jnp.broadcast_to(target, out.shape), atol=1e-5)


def test_fresh_noise_needs_a_key():
    solver = FlowEuler(num_steps=4, shift=3.0)
    p = dvg.plan(dvg.Schedule.of([(2, 2, 2), (1, 1, 2)]), LATENT, (1, 2, 2), solver, noise="fresh")
    noise = jnp.zeros((1, *LATENT, 4), jnp.float32)
    with pytest.raises(ValueError, match="PRNG key"):
        dvg.sample(lambda x, t, pos: x, noise, p)
    a = dvg.sample(lambda x, t, pos: -x, noise, p, key=jax.random.key(0))
    b = dvg.sample(lambda x, t, pos: -x, noise, p, key=jax.random.key(1))
    assert float(jnp.max(jnp.abs(a - b))) > 1e-3


@pytest.mark.parametrize("accel", ["spatial", "temporal", "joint", "dvg"])
def test_accel_modes_run_few_step_schedules_within_budget(toy, accel):
    model, cond, negative, noise = toy
    solver = UniPC(num_steps=4, shift=3.0)
    out, choices = dvg.accelerate(
        model, noise, cond, negative, solver=solver, guidance=GUIDANCE, accel=accel, budget=0.6
    )
    assert out.shape == noise.shape and bool(jnp.all(jnp.isfinite(out)))
    (choice,) = choices
    assert choice.schedule.num_steps == 4 and choice.cost <= 0.6
    if accel != "dvg":
        assert choice.family == accel
    else:  # several schedules fit: the probe measured the video
        families = ("spatial", "temporal", "joint")
        assert selector.settled(LATENT, (1, 2, 2), solver.sigmas, 0.6, families=families) is None
        assert choice.signals is not None and all(0 <= s <= 1 for s in choice.signals)


def test_a_settled_choice_spends_no_probe(toy, monkeypatch):
    # Temporal-only at this budget, one schedule wins for any content: DVG runs it without the
    # probe (which would cost 0.25 more here), the same video as the temporal family's.
    model, cond, negative, noise = toy
    solver = UniPC(num_steps=4, shift=3.0)
    policy = dvg.Policy(spatial=False)
    kw = dict(solver=solver, guidance=GUIDANCE, budget=0.8, policy=policy)
    want, (fixed,) = dvg.accelerate(model, noise, cond, negative, accel="temporal", **kw)
    settled = selector.settled(LATENT, (1, 2, 2), solver.sigmas, 0.8, policy=policy)
    assert settled is not None and settled.schedule == fixed.schedule

    def no_probe(*args, **kwargs):
        raise AssertionError("the probe ran for a settled choice")

    monkeypatch.setattr(dvg_sampler, "probe", no_probe)
    got, (choice,) = dvg.accelerate(model, noise, cond, negative, accel="dvg", **kw)
    assert choice.schedule == fixed.schedule and choice.signals is None
    assert choice.cost == pytest.approx(fixed.cost)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bad_accel_and_budget_raise(toy):
    model, cond, negative, noise = toy
    solver = UniPC(num_steps=4, shift=3.0)
    kw = dict(solver=solver, guidance=GUIDANCE)
    with pytest.raises(ValueError, match="accel must be one of"):
        dvg.accelerate(model, noise, cond, negative, accel="fast", **kw)
    with pytest.raises(ValueError, match="budget must be in"):
        dvg.accelerate(model, noise, cond, negative, budget=0.0, **kw)
    # no temporal factor divides 6 frames (5 gaps)
    six = jnp.concatenate([noise, noise[:, :1]], axis=1)
    with pytest.raises(ValueError, match="no temporal schedule"):
        dvg.accelerate(model, six, cond, negative, accel="temporal", budget=0.5, **kw)
    # below every schedule (4 steps: one full step is 0.25): the cheapest runs, with a warning
    for accel in ("temporal", "dvg"):
        with pytest.warns(UserWarning, match="below the cheapest"):
            out, (choice,) = dvg.accelerate(
                model, noise, cond, negative, accel=accel, budget=0.05, **kw
            )
        assert bool(jnp.all(jnp.isfinite(out))) and 0.25 < choice.cost < 1.0
        if accel == "temporal":
            found = dvg.candidates(LATENT, (1, 2, 2), 4, 1.0, families=("temporal",))
            assert choice.cost == pytest.approx(min(c.cost for c in found))


def test_a_policy_without_space_runs_temporal_and_warns_on_explicit_space(toy):
    model, cond, negative, noise = toy
    kw = dict(solver=UniPC(num_steps=4, shift=3.0), guidance=GUIDANCE, budget=0.6)
    no_space = dvg.Policy(spatial=False)
    _, (choice,) = dvg.accelerate(model, noise, cond, negative, accel="dvg", policy=no_space, **kw)
    assert choice.family == "temporal"
    assert all(stage.s_factor == 1 for stage in choice.schedule.stages)
    with pytest.warns(UserWarning, match="cheapest temporal schedule"):  # names what it tried
        dvg.accelerate(
            model, noise, cond, negative, accel="dvg", policy=no_space, **{**kw, "budget": 0.05}
        )
    with pytest.warns(UserWarning, match="rules out"):
        _, (choice,) = dvg.accelerate(
            model, noise, cond, negative, accel="spatial", policy=no_space, **kw
        )
    assert choice.family == "spatial"


def test_the_tiny_preset_keeps_dvg_off_space():
    # Trained at one resolution: its spatial stages ruin the video (docs/dvg.md section 6.1).
    assert get("tiny").dvg_spatial is False and get("wan2.1-1.3b").dvg_spatial is True


def test_resuming_from_the_probe_equals_running_stage_zero(toy):
    model, cond, negative, noise = toy
    solver = UniPC(num_steps=4, shift=3.0)
    p = dvg.plan(dvg.Schedule.of([(2, 2, 2), (1, 1, 2)]), LATENT, (1, 2, 2), solver)
    probed = dvg.probe(model, noise, cond, negative, plan=p, guidance=GUIDANCE)
    assert probed.x0.shape == probed.eps_hat.shape == (1, 3, 4, 4, noise.shape[-1])
    assert probed.signals.shape == (1, 2) and probed.stage == dvg.Stage(2, 2, 2)
    whole = dvg.denoise(model, noise, cond, negative, plan=p, guidance=GUIDANCE)
    resumed = dvg.denoise(model, noise, cond, negative, plan=p, guidance=GUIDANCE, resume=probed)
    np.testing.assert_allclose(resumed, whole, atol=1e-5)
    # a schedule that refines through another grid after the probe's stage resumes too
    p3 = dvg.plan(dvg.Schedule.of([(2, 2, 2), (1, 2, 1), (1, 1, 1)]), LATENT, (1, 2, 2), solver)
    assert probed.resumes(p3.schedule)
    np.testing.assert_allclose(
        dvg.denoise(model, noise, cond, negative, plan=p3, guidance=GUIDANCE, resume=probed),
        dvg.denoise(model, noise, cond, negative, plan=p3, guidance=GUIDANCE),
        atol=1e-5,
    )
    # same grid, different steps: the probe's noise levels are not this stage's
    other = dvg.plan(dvg.Schedule.of([(2, 2, 3), (1, 1, 1)]), LATENT, (1, 2, 2), solver)
    assert not probed.resumes(other.schedule)
    with pytest.raises(ValueError, match="resume needs"):
        dvg.denoise(model, noise, cond, negative, plan=other, guidance=GUIDANCE, resume=probed)
    with pytest.raises(ValueError, match="reduced first stage"):
        dvg.probe(
            model,
            noise,
            cond,
            negative,
            plan=dvg.plan(dvg.Schedule.full(4), LATENT, (1, 2, 2), solver),
            guidance=GUIDANCE,
        )


def test_probe_stage_keeps_enough_frames_and_pixels():
    # 9x16x16 (the tiny model's latent): coarsest grid with >= 3 frames and >= 8 pixels across
    assert dvg.probe_stage((9, 16, 16), (1, 2, 2), 20) == dvg.Stage(4, 2, 5)
    assert dvg.probe_stage((9, 16, 16), (1, 2, 2), 1) is None  # nothing left after a probe
    assert dvg.probe_stage((1, 6, 6), (1, 2, 2), 20) is None  # no factor divides


def test_videos_choosing_different_schedules_are_regrouped_in_order(toy, monkeypatch):
    model, cond, negative, noise = toy
    solver = UniPC(num_steps=4, shift=3.0)
    noise3 = jnp.concatenate([noise, noise * 0.5, -noise], axis=0)
    cond3, negative3 = (
        jax.tree.map(lambda a: jnp.repeat(a, 3, axis=0), c) for c in (cond, negative)
    )
    picks = iter(["spatial", "temporal", "spatial"])
    real_select = dvg.selector.select

    def fake_select(*args, **kwargs):
        if args[4] is None:  # the feasibility check before the probe
            return real_select(*args, **kwargs)
        return real_select(*args, **{**kwargs, "families": (next(picks),)})

    monkeypatch.setattr(dvg.selector, "select", fake_select)
    out, choices = dvg.accelerate(
        model, noise3, cond3, negative3, solver=solver, guidance=GUIDANCE, budget=0.7
    )
    assert [c.family for c in choices] == ["spatial", "temporal", "spatial"]
    for i, c in enumerate(choices):
        p = dvg.plan(c.schedule, LATENT, (1, 2, 2), solver)
        one = dvg.denoise(
            model,
            noise3[i : i + 1],
            jax.tree.map(lambda a, i=i: a[i : i + 1], cond3),
            jax.tree.map(lambda a, i=i: a[i : i + 1], negative3),
            plan=p,
            guidance=GUIDANCE,
        )
        np.testing.assert_allclose(out[i : i + 1], one, atol=1e-5)


def test_sharded_equals_single_device_with_mesh_padding(tiny):
    model, cond, negative, noise = tiny
    solver = FlowEuler(num_steps=3, shift=3.0)
    mesh = make_mesh((2, 4), ("data", "seq"))
    # (2, 4): a 3x2x2 latent = 3 tokens, padded to 4 for the 4-way seq axis.
    schedule = dvg.Schedule.of([(2, 4, 1), (2, 2, 1), (1, 1, 1)])
    with use_mesh(mesh, "fsdp_sp"):
        assert dvg.sampler._mesh_multiple() == 4
    p = dvg.plan(schedule, LATENT, (1, 2, 2), solver, multiple=4)
    for stage in p.stages[:-1]:
        grid = np.asarray(stage.padded) // np.asarray((1, 2, 2))
        assert np.prod(grid) % 4 == 0
    assert p.stages[0].pad != (0, 0, 0)
    noise2 = jnp.concatenate([noise, -noise], axis=0)
    cond2, negative2 = (
        jax.tree.map(lambda a: jnp.repeat(a, 2, axis=0), c) for c in (cond, negative)
    )
    single = dvg.denoise(model, noise2, cond2, negative2, plan=p, guidance=GUIDANCE)

    sharded_model = nnx.clone(model)
    state = nnx.state(sharded_model)
    nnx.update(sharded_model, jax.device_put(state, param_shardings(state, mesh, "fsdp_sp")))
    with use_mesh(mesh, "fsdp_sp"):
        sharded_noise = jax.device_put(
            noise2, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        )
        got = dvg.denoise(sharded_model, sharded_noise, cond2, negative2, plan=p, guidance=GUIDANCE)
    np.testing.assert_allclose(got, single, atol=2e-5)
