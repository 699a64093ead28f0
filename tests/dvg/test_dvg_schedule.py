"""Stage schedules: validation, grids, the resolution-dependent shift and the stage solvers."""

import math

import numpy as np
import pytest

from vidax.dvg import Schedule, Stage, plan, reduced_shape
from vidax.sampling import FlowEuler, UniPC, shift_sigmas

LATENT = (9, 8, 8)
PATCH = (1, 2, 2)


def test_stage_with_zero_steps_raises():
    with pytest.raises(ValueError, match="at least one step"):
        Stage(2, 2, 0)
    with pytest.raises(ValueError, match="at least one step"):
        Schedule.of([(2, 2, 0), (1, 1, 4)])


@pytest.mark.parametrize(
    "stages, match",
    [
        ([], "at least one stage"),
        ([(2, 2, 3)], "last stage must be full resolution"),
        ([(2, 2, 3), (2, 2, 3), (1, 1, 2)], "share the grid"),
        ([(4, 2, 2), (3, 1, 2), (1, 1, 2)], "does not divide the previous"),
        ([(0, 2, 2), (1, 1, 2)], ">= 1"),
        ([(2.0, 2, 2), (1, 1, 2)], "must be an int"),
    ],
)
def test_invalid_schedules_raise(stages, match):
    with pytest.raises(ValueError, match=match):
        Schedule.of(stages)


@pytest.mark.parametrize(
    "factors, match",
    [((3, 1), "temporal factor 3 does not divide"), ((1, 3), "spatial factor 3 does not divide")],
)
def test_factors_that_do_not_divide_the_latent_raise(factors, match):
    with pytest.raises(ValueError, match=match):
        reduced_shape(LATENT, factors)
    schedule = Schedule.of([(*factors, 2), (1, 1, 2)])
    with pytest.raises(ValueError, match=match):
        plan(schedule, LATENT, PATCH, FlowEuler(num_steps=4, shift=3.0))


def test_plan_rejects_step_mismatch_and_unknown_options():
    schedule = Schedule.of([(2, 2, 2), (1, 1, 2)])
    solver = FlowEuler(num_steps=5, shift=3.0)
    with pytest.raises(ValueError, match="4 steps but the solver 5"):
        plan(schedule, LATENT, PATCH, solver)
    solver = FlowEuler(num_steps=4, shift=3.0)
    with pytest.raises(ValueError, match="spatial upsampling"):
        plan(schedule, LATENT, PATCH, solver, spatial="bogus")
    with pytest.raises(ValueError, match="temporal upsampling"):
        plan(schedule, LATENT, PATCH, solver, temporal="cubic")
    with pytest.raises(ValueError, match="not divisible by the patch"):
        plan(schedule, (9, 7, 8), PATCH, solver)


def test_nested_frames_and_spatial_sizes():
    assert reduced_shape((21, 60, 104), (2, 2)) == (11, 30, 52)
    assert reduced_shape((21, 60, 104), (4, 4)) == (6, 15, 26)
    assert reduced_shape((9, 8, 8), (8, 1)) == (2, 8, 8)


def test_resolution_dependent_shift_matches_pooled_snr():
    """Averaging k elements of x_sigma = (1-s) x0 + s eps (smooth x0) divides the noise std by
    sqrt(k): its noise-to-signal ratio is that of shift(sigma, 1/sqrt(k))."""
    sigma = np.linspace(0.05, 0.95, 19)
    for k in (2, 4, 8, 16):
        pooled_ratio = (sigma / math.sqrt(k)) / (1 - sigma)
        lo = shift_sigmas(sigma, 1 / math.sqrt(k))
        np.testing.assert_allclose(lo / (1 - lo), pooled_ratio, rtol=1e-12)


@pytest.mark.parametrize(
    "solver", [FlowEuler(num_steps=8, shift=3.0), UniPC(num_steps=8, shift=5.0)]
)
def test_stage_sigmas_share_one_time_grid_with_a_per_frame_token_shift(solver):
    schedule = Schedule.of([(2, 2, 3), (1, 2, 2), (1, 1, 3)])
    p = plan(schedule, LATENT, PATCH, solver)
    base = np.asarray(solver.sigmas, np.float64)
    assert [(s.start, s.stop) for s in p.stages] == [(0, 3), (3, 5), (5, 8)]
    for stage in p.stages[:-1]:
        # tokens per frame: dropping frames averages nothing, so time does not shift
        ratio = stage.shape[1] * stage.shape[2] / (LATENT[1] * LATENT[2])
        assert stage.shift == pytest.approx(math.sqrt(ratio))
        want = shift_sigmas(base[stage.start : stage.stop], math.sqrt(ratio))
        np.testing.assert_allclose(stage.solver.sigmas[:-1], want, rtol=1e-6)
        assert stage.solver.sigmas[-1] == 0  # a reduced stage ends on its clean prediction
        assert stage.solver.num_steps == stage.stop - stage.start
    last = p.stages[-1]
    np.testing.assert_allclose(last.solver.sigmas, base[5:], rtol=1e-6)
    # The finer grid re-enters at a higher noise level than the coarse one would reach.
    assert p.stages[2].entry_sigma > shift_sigmas(base[5], p.stages[1].shift)
    temporal_only = plan(Schedule.of([(2, 1, 3), (1, 1, 5)]), LATENT, PATCH, solver)
    assert temporal_only.stages[0].shift == 1.0


def test_full_schedule_is_the_base_solver():
    solver = UniPC(num_steps=6, shift=3.0)
    p = plan(Schedule.full(6), LATENT, PATCH, solver)
    assert p.is_full and p.stages[0].solver is solver and p.stages[0].pad == (0, 0, 0)


def test_padding_to_patch_and_mesh_multiple():
    solver = FlowEuler(num_steps=4, shift=3.0)
    # 9x6x6 latent / 2 spatially -> 3x3 pixels: padded to 4x4 (patch 2).
    p = plan(Schedule.of([(1, 2, 2), (1, 1, 2)]), (9, 6, 6), PATCH, solver)
    assert p.stages[0].shape == (9, 3, 3) and p.stages[0].padded == (9, 4, 4)
    # 5x4x4 latent -> 5x2x2 tokens = 20; the fewest tokens that are a multiple of 8: one more
    # frame (6x2x2 = 24), fewer than padding space (5x4x2 = 40).
    p = plan(Schedule.of([(2, 2, 2), (1, 1, 2)]), LATENT, PATCH, solver, multiple=8)
    assert p.stages[0].shape == (5, 4, 4) and p.stages[0].padded == (6, 4, 4)
    assert p.stages[-1].pad == (0, 0, 0)
