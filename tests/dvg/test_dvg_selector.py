"""The selector: signals on crafted latents, candidate budgets, and its choices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.dvg import (
    DEFAULT_POLICY,
    Policy,
    Schedule,
    Stage,
    candidates,
    choose,
    ladders,
    measure,
    probe_stage,
    reduced_shape,
    relative_cost,
    selector,
    step_flops,
)
from vidax.models.wan import PRESETS
from vidax.sampling import UniPC

CONFIG = PRESETS["tiny"]
LATENT = (9, 8, 8)
PATCH = (1, 2, 2)
SOLVER = UniPC(num_steps=20, shift=3.0)


def _blob_video(speed: float, frames: int = 9, size: int = 16) -> jax.Array:
    """A smooth Gaussian blob moving right by `speed` pixels per frame, (1, t, h, w, 4)."""
    yy, xx = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    video = []
    for t in range(frames):
        cx = 3 + speed * t
        video.append(np.exp(-((yy - size / 2) ** 2 + (xx - cx) ** 2) / 8.0))
    v = np.stack(video)[None, ..., None] * np.array([1.0, -0.5, 0.3, 2.0])
    return jnp.asarray(v, jnp.float32)


def _cost(shape):
    return step_flops(CONFIG, shape)


def test_measure_separates_still_from_moving_and_smooth_from_detailed():
    still, slow, fast = (measure(_blob_video(s))[0] for s in (0.0, 0.3, 1.5))
    assert float(still[0]) < 1e-6
    assert float(still[0]) < float(slow[0]) < float(fast[0])
    noise = jax.random.normal(jax.random.key(0), (1, 9, 16, 16, 4), jnp.float32)
    detail_noise = float(measure(noise)[0, 1])
    assert float(still[1]) < 0.1 < 0.6 < detail_noise <= 1.0
    assert measure(jnp.zeros((2, 1, 4, 4, 4))).shape == (2, 2)


def test_candidates_respect_the_budget_and_full_resolution_steps():
    found = candidates(LATENT, PATCH, 20, 0.35)
    assert {c.family for c in found} == {"spatial", "temporal", "joint"}
    for c in found[::37]:
        assert c.cost <= 0.35 + 1e-9
        token_steps = sum(
            s.steps * np.prod(reduced_shape(LATENT, s.factors)) for s in c.schedule.stages
        )
        assert c.cost == pytest.approx(token_steps / (20 * np.prod(LATENT)))
        assert c.schedule.num_steps == 20 and c.schedule.stages[-1].steps >= 2
    by_flops = candidates(LATENT, PATCH, 20, 0.35, _cost)
    for c in by_flops[::37]:
        assert c.cost == pytest.approx(relative_cost(c.schedule, CONFIG, LATENT))
    assert [c.family for c in candidates(LATENT, PATCH, 20, 1.0, _cost, families=("none",))] == [
        "none"
    ]
    assert candidates(LATENT, PATCH, 20, 0.01, _cost) == []
    with pytest.raises(ValueError, match="unknown families"):
        candidates(LATENT, PATCH, 20, 0.5, _cost, families=("bogus",))


def test_the_probe_is_charged_unless_a_schedule_resumes_from_it():
    probe = Stage(4, 2, 5)
    probe_cost = 5 * np.prod(reduced_shape(LATENT, (4, 2))) / (20 * np.prod(LATENT))
    plain = {c.schedule: c.cost for c in candidates(LATENT, PATCH, 20, 0.4)}
    charged = {c.schedule: c.cost for c in candidates(LATENT, PATCH, 20, 0.4, probe=probe)}
    resumed = [s for s in charged if s.stages[0] == probe]
    assert resumed and all(charged[s] == pytest.approx(plain[s]) for s in resumed)
    others = [s for s in charged if s.stages[0] != probe]
    assert others and all(charged[s] == pytest.approx(plain[s] + probe_cost) for s in others)
    assert set(charged) <= set(plain)


def test_ladders_only_use_dividing_factors():
    lad = ladders((6, 16, 24), PATCH)
    assert lad["temporal"] == []  # 5 frame gaps: no factor of 2, 4, 8 divides
    assert all(f[1] in (1, 2, 4) for ladder in lad["spatial"] for f in ladder)  # 24 % 8 != 0


def test_ladders_keep_two_tokens_across_and_fit_the_tiny_latent():
    # the tiny model's 9x16x16 latent, patch 1x2x2: s/8 would leave one token per frame
    lad = ladders((9, 16, 16), PATCH)
    spatial = {f[1] for family in lad.values() for ladder in family for f in ladder}
    temporal = {f[0] for family in lad.values() for ladder in family for f in ladder}
    assert spatial == {1, 2, 4} and temporal == {1, 2, 4, 8}  # 9 frames: 5, 3, 2 kept
    for family in lad.values():
        for ladder in family:
            for f in ladder:
                t, h, w = reduced_shape((9, 16, 16), f)
                assert t >= 2 and h // PATCH[1] >= 2 and w // PATCH[2] >= 2
    relaxed = ladders((9, 16, 16), PATCH, Policy(min_tokens=1))
    assert ((1, 8), (1, 1)) in relaxed["spatial"]


def test_static_scene_gets_strong_temporal_reduction_fast_motion_keeps_frames():
    found = candidates(LATENT, PATCH, 20, 0.35, _cost)
    static = tuple(float(v) for v in measure(_blob_video(0.0))[0])
    moving = tuple(float(v) for v in measure(_blob_video(1.5))[0])
    still_choice = choose(found, static, LATENT, SOLVER.sigmas)
    fast_choice = choose(found, moving, LATENT, SOLVER.sigmas)
    # the still scene keeps time reduced (>= 4x) until the full-resolution stage
    assert still_choice.family in ("temporal", "joint")
    assert still_choice.schedule.stages[-2].t_factor >= 4

    # fast motion restores its frames within the first few (noise-dominated) steps and spends
    # the budget on spatial reduction; the still scene keeps time reduced for most steps
    def steps_with_frames_dropped(c):
        return sum(s.steps for s in c.schedule.stages if s.t_factor > 1)

    assert (
        steps_with_frames_dropped(fast_choice) <= 4 < 12 <= steps_with_frames_dropped(still_choice)
    )
    assert any(s.t_factor == 1 and s.s_factor > 1 for s in fast_choice.schedule.stages)
    assert still_choice.cost <= 0.35 and fast_choice.cost <= 0.35
    assert fast_choice.predicted_loss > still_choice.predicted_loss


def test_tolerance_falls_back_to_full_sampling():
    found = candidates(LATENT, PATCH, 20, 0.35, _cost)
    strict = Policy(tolerance=0.01)
    choice = choose(found, (0.9, 0.9), LATENT, SOLVER.sigmas, policy=strict)
    assert choice.family == "none" and choice.schedule == Schedule.full(20)
    assert choose(found, (0.0, 0.0), LATENT, SOLVER.sigmas, policy=strict).family != "none"
    with pytest.raises(ValueError, match="no candidate"):
        choose([], (0.1, 0.1), LATENT, SOLVER.sigmas)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"probe": 0.0}, "probe"),
        ({"min_full": 1.0}, "min_full"),
        ({"factors": (1,)}, "factors"),
        ({"min_tokens": 0}, "min_tokens"),
    ],
)
def test_policy_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Policy(**kwargs)
    assert DEFAULT_POLICY.probe_steps(4) >= 1


def test_coarser_grids_predict_more_loss_with_detail_and_none_without():
    latent = (9, 16, 16)
    two, four = (Schedule.of([(1, f, 10), (1, 1, 10)]) for f in (2, 4))
    found = [c for c in candidates(latent, PATCH, 20, 1.0) if c.schedule in (two, four)]
    assert len(found) == 2
    for signals in [(0.0, 0.3), (0.3, 0.0)]:
        loss = {
            c.schedule: choose([c], signals, latent, SOLVER.sigmas).predicted_loss for c in found
        }
        if signals[1] > 0:
            assert loss[four] > loss[two] > 0
        else:  # spatial-only grids lose no motion: only the small content-independent term
            assert loss[four] == pytest.approx(loss[two], abs=DEFAULT_POLICY.base_weight)
    # the same schedules with no detail cost (almost) nothing
    still = choose(found, (0.0, 0.0), latent, SOLVER.sigmas)
    assert still.predicted_loss < DEFAULT_POLICY.base_weight


def test_a_policy_without_space_keeps_only_temporal_ladders():
    policy = Policy(spatial=False)
    lad = ladders((9, 16, 16), PATCH, policy)
    assert lad["spatial"] == [] and lad["joint"] == []
    assert lad["temporal"] == ladders((9, 16, 16), PATCH)["temporal"]
    found = candidates((9, 16, 16), PATCH, 20, 0.5, policy=policy)
    assert found and {c.family for c in found} == {"temporal"}
    # the probe moves to the coarsest temporal grid (3 frames at full spatial size)
    assert probe_stage((9, 16, 16), PATCH, 20, policy) == Stage(4, 1, 5)


def test_settled_when_the_content_cannot_change_the_choice():
    latent, patch = (9, 16, 16), (1, 2, 2)
    temporal = Policy(spatial=False)
    # below every temporal schedule of 20 steps, only the cheapest is left
    one = selector.select(latent, patch, SOLVER.sigmas, 0.2, None, policy=temporal)
    assert one is None
    got = selector.settled(latent, patch, SOLVER.sigmas, 0.2, policy=temporal)
    assert got is not None and got.signals is None
    assert got.cost == pytest.approx(
        selector.cheapest(latent, patch, SOLVER.sigmas, policy=temporal)
    )
    # asked again (every video of a run asks), the answer comes from the cache
    assert selector.settled(latent, patch, list(SOLVER.sigmas), 0.2, policy=temporal) is got
    # with spatial and joint ladders, still and detailed videos pick differently: not settled
    assert selector.settled(latent, patch, SOLVER.sigmas, 0.2) is None
    still = selector.select(latent, patch, SOLVER.sigmas, 0.2, (0.0, 1.0))
    moving = selector.select(latent, patch, SOLVER.sigmas, 0.2, (1.0, 0.0))
    assert still.schedule != moving.schedule
