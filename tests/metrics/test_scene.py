import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from vidax.data import EVAL_PROMPTS, ClipSpec, ObjectSpec, caption, render
from vidax.data.shapes import PALETTE
from vidax.metrics import (
    caption_adherence,
    evaluate,
    motion_fidelity,
    motion_magnitude,
    shapes_read,
    subject_consistency,
    subject_scores,
    summarise,
    trajectory_error,
)

PROMPTS = {p.name: p for p in EVAL_PROMPTS}
MOVING = ["slow-0", "fast-0", "bouncing-1", "multi-1", "pan-5"]


@pytest.fixture(scope="module")
def rendered():
    return {p.name: render(p.spec, 33)[0] for p in EVAL_PROMPTS}


def test_ground_truth_scores_high_on_every_eval_prompt(rendered):
    results = []
    for p in EVAL_PROMPTS:
        r = evaluate(rendered[p.name], p.spec)
        assert r["caption_adherence"] == 1.0, p.name
        assert r["caption_motion_adherence"] == 1.0, p.name
        assert r["motion_fidelity"] >= 0.95, p.name
        assert r["subject_consistency"] >= 0.95, p.name
        assert r["trajectory_error"] < 0.01, p.name
        assert r["temporal_flicker"] < 0.01, p.name
        # The caption alone gives the same verdicts as the spec.
        assert motion_fidelity(rendered[p.name], p.caption) == r["motion_fidelity"]
        results.append(r)
    summary = summarise(results)
    assert summary["caption_adherence"].mean == 1.0 and summary["caption_adherence"].std == 0.0
    assert summary["motion_fidelity"].n == len(EVAL_PROMPTS)


def test_evaluate_with_reference(rendered):
    video = rendered["fast-0"]
    r = evaluate(video, PROMPTS["fast-0"].caption, reference=video)
    assert r["psnr"] == math.inf and r["ssim"] == pytest.approx(1.0)
    assert r["perceptual_distance"] == 0.0
    assert "trajectory_error" not in r  # a caption has no ground-truth paths
    assert evaluate(jnp.asarray(video), PROMPTS["fast-0"].spec) == evaluate(
        video, PROMPTS["fast-0"].spec
    )
    single = evaluate(video[:1], PROMPTS["fast-0"].caption)
    assert math.isnan(single["motion_fidelity"]) and single["caption_adherence"] == 1.0


def test_adherence_drops_for_a_wrong_colour_or_shape():
    spec = PROMPTS["multi-3"].spec  # three objects
    objs = spec.objects
    wrong_shape = dataclasses.replace(
        objs[0], shape="square" if objs[0].shape != "square" else "circle"
    )
    wrong_colour = dataclasses.replace(objs[1], colour="white")  # unused in this clip
    for i, changed in ((0, wrong_shape), (1, wrong_colour)):
        new = tuple(changed if j == i else o for j, o in enumerate(objs))
        video = render(dataclasses.replace(spec, objects=new), 17)[0]
        assert caption_adherence(video, spec) == pytest.approx(2 / 3)
        assert caption_adherence(video, dataclasses.replace(spec, objects=new)) == 1.0
    video = render(spec, 17)[0]
    other = "a white circle standing still, a green triangle bouncing fast to the left"
    assert caption_adherence(video, other) == 0.0


def test_shapes_read_names_what_is_drawn():
    spec = PROMPTS["multi-3"].spec
    objs = spec.objects
    other = "square" if objs[0].shape != "square" else "circle"
    drawn = (
        dataclasses.replace(objs[0], shape=other),
        dataclasses.replace(objs[1], colour="white"),
    )
    video = render(dataclasses.replace(spec, objects=(*drawn, objs[2])), 17)[0]
    assert shapes_read(video, spec) == [
        (objs[0].shape, other),  # the wrong shape is read as what was drawn
        (objs[1].shape, None),  # its colour is absent: missing
        (objs[2].shape, objs[2].shape),
    ]
    assert shapes_read(render(spec, 17)[0], spec) == [(o.shape, o.shape) for o in objs]


def test_frozen_video(rendered):
    for name in MOVING:
        frozen = np.repeat(rendered[name][:1], 33, axis=0)
        assert motion_magnitude(frozen) == 0.0
        assert motion_fidelity(frozen, PROMPTS[name].spec) < 0.5
        assert caption_adherence(frozen, PROMPTS[name].spec) == 1.0
        assert caption_adherence(frozen, PROMPTS[name].spec, check_motion=True) < 0.5
    # A static prompt is satisfied by a frozen video.
    static = np.repeat(rendered["static-3"][:1], 33, axis=0)
    assert motion_fidelity(static, PROMPTS["static-3"].spec) == 1.0
    assert motion_magnitude(rendered["fast-0"]) == pytest.approx(0.04, abs=0.002)


def test_shuffled_video_has_poor_motion_fidelity(rendered):
    rng = np.random.default_rng(0)
    for name in MOVING:
        video = rendered[name]
        shuffled = video[rng.permutation(len(video))]
        good, bad = (
            motion_fidelity(video, PROMPTS[name].spec),
            motion_fidelity(shuffled, PROMPTS[name].spec),
        )
        assert bad < 0.7 and bad < good - 0.3, name


def test_colour_change_lowers_subject_consistency():
    spec = PROMPTS["slow-0"].spec
    recoloured = dataclasses.replace(
        spec, objects=(dataclasses.replace(spec.objects[0], colour="yellow"),)
    )
    a, b = render(spec, 32)[0], render(recoloured, 32)[0]
    changed = np.concatenate([a[:16], b[16:]])
    assert subject_consistency(a) > 0.95
    assert subject_consistency(changed) < 0.6
    reshaped = dataclasses.replace(
        spec, objects=(dataclasses.replace(spec.objects[0], shape="triangle"),)
    )
    morphed = np.concatenate([a[:16], render(reshaped, 32)[0][16:]])
    assert subject_consistency(morphed) < 0.6
    flashing = a.copy()
    flashing[::4] = render(
        dataclasses.replace(spec, objects=(dataclasses.replace(spec.objects[0], size=0.2),)), 32
    )[0][::4]
    assert subject_consistency(flashing) < subject_consistency(a) - 0.1


def test_caption_motion_must_match(rendered):
    video = rendered["fast-0"]  # a yellow circle bouncing fast to the right
    assert motion_fidelity(video, "a yellow circle bouncing fast to the right") > 0.999
    assert motion_fidelity(video, "a yellow circle bouncing slowly to the right") < 0.7
    assert motion_fidelity(video, "a yellow circle standing still") < 0.3
    assert motion_fidelity(video, "a yellow circle bouncing fast to the left") < 0.7
    assert motion_fidelity(video, "a blue circle bouncing fast to the right") == 0.0  # not there
    slow = rendered["slow-0"]
    assert motion_fidelity(slow, "a green circle bouncing fast to the right") < 0.7


def _disc_video(centres, radius=6.4) -> np.ndarray:
    """A red disc at each (x, y) pixel centre in turn (off-frame parts cut), on flat grey.

    Drawn here rather than with `render`, whose physics would fold it back inside the frame.
    """
    ys, xs = np.mgrid[:64, :64] + 0.5
    red = np.asarray([1.0, 0.15, 0.15], np.float32) * 2 - 1
    frames = np.full((len(centres), 64, 64, 3), -0.6, np.float32)
    for t, (cx, cy) in enumerate(centres):
        alpha = np.clip(radius + 0.5 - np.hypot(xs - cx, ys - cy), 0, 1)[..., None]
        frames[t] += alpha * (red - frames[t])
    return frames


def test_moving_objects_must_bounce_at_walls():
    text = "a red circle bouncing fast to the right"
    proper = render(
        ClipSpec(
            objects=(
                ObjectSpec(
                    shape="circle",
                    colour="red",
                    size=0.1,
                    position=(0.5, 0.5),
                    motion="fast",
                    direction="right",
                ),
            ),
            seed=1,
        ),
        24,
    )[0]
    step = 0.04 * 64
    # Through the wall: it moves on at the same speed, is cut by the edge, then gone.
    through = _disc_video([(32 + step * t, 32) for t in range(24)])
    # Turning back in the middle of the frame, far from any wall.
    turning = _disc_video([(20 + step * min(t, 8) - step * max(t - 8, 0), 32) for t in range(24)])
    assert motion_fidelity(_disc_video([(20 + step * t, 32) for t in range(8)]), text) == 1.0
    good = motion_fidelity(proper, text)
    assert good > 0.999
    assert motion_fidelity(through, text) < good - 0.25
    assert motion_fidelity(turning, "a red circle bouncing fast to the right") < good - 0.15


def test_trajectory_error(rendered):
    spec = PROMPTS["multi-2"].spec
    video = rendered["multi-2"]
    assert trajectory_error(video, spec) < 0.01
    shifted = np.roll(video, 5, axis=2)  # 5 px right
    assert trajectory_error(shifted, spec) == pytest.approx(5 / 64, abs=0.01)
    assert trajectory_error(rendered["static-1"], spec) == 1.0  # a blue square: none of its objects


def test_summarise():
    out = summarise([{"a": 1.0, "b": math.inf}, {"a": 3.0, "b": 2.0}, {"a": math.nan, "c": 5.0}])
    assert out["a"].mean == 2.0 and out["a"].std == 1.0 and out["a"].n == 2
    assert out["b"].mean == 2.0 and out["b"].n == 1
    assert out["c"].n == 1
    assert str(out["a"]) == "2 ± 1 (n=2)"
    nothing = summarise([{"a": math.nan}])["a"]
    assert nothing.n == 0 and math.isnan(nothing.mean)
    with pytest.raises(ValueError):
        summarise([])


def test_bad_inputs_raise(rendered):
    video = rendered["fast-0"]
    with pytest.raises(ValueError, match="2 frames"):
        motion_fidelity(video[:1], PROMPTS["fast-0"].spec)
    with pytest.raises(TypeError):
        motion_fidelity(video, 42)
    with pytest.raises(ValueError):
        caption_adherence(video, "a purple hexagon")
    assert caption(PROMPTS["fast-0"].spec) == PROMPTS["fast-0"].caption


def test_subject_scores_are_the_terms_subject_consistency_averages():
    spec = PROMPTS["multi-1"].spec
    video = render(spec, 32)[0]
    # A speck of an unasked colour in a quarter of the frames is a (weak) object of its own.
    asked = {o.colour for o in spec.objects}
    unasked = next(c for c in PALETTE if c not in asked)
    speck = video.copy()
    speck[::4, 2:6, 2:6] = np.asarray(PALETTE[unasked]) * 2 - 1
    for v in (video, speck):
        parts = subject_scores(v)
        assert subject_consistency(v) == pytest.approx(np.mean([p.score for p in parts]), abs=0)
    assert {p.colour for p in subject_scores(video)} == asked
    extra = [p for p in subject_scores(speck) if p.colour not in asked]
    assert len(extra) == 1 and extra[0].presence == pytest.approx(0.25)
    assert extra[0].shape_agreement == 1.0 and extra[0].area_stability == 1.0
    assert subject_consistency(speck) < subject_consistency(video) - 0.2
