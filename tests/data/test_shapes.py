import dataclasses

import numpy as np
import pytest

from vidax.data import LoaderConfig, clip_at, shapes
from vidax.data.shapes import (
    EVAL_PROMPTS,
    PALETTE,
    PAN_SPEED,
    SPEED,
    CaptionObject,
    ClipSpec,
    ObjectSpec,
    caption,
    extent,
    parse_caption,
    parse_pan,
    render,
    sample_spec,
    trajectories,
)


def _colour_mask(frames: np.ndarray, colour: str, tol: float = 0.3) -> np.ndarray:
    """(t, h, w) pixels within `tol` of a palette colour (test-local, independent of metrics)."""
    unit = (frames + 1) / 2
    return np.linalg.norm(unit - np.asarray(PALETTE[colour]), axis=-1) < tol


def _centroids(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.mgrid[: mask.shape[1], : mask.shape[2]]
    n = mask.sum((1, 2))
    return np.stack([(mask * (xs + 0.5)).sum((1, 2)) / n, (mask * (ys + 0.5)).sum((1, 2)) / n], -1)


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shape": "hexagon", "colour": "red"},
        {"shape": "circle", "colour": "purple"},
        {"shape": "circle", "colour": "red", "size": 0.5},
        {"shape": "circle", "colour": "red", "position": (1.2, 0.5)},
        {"shape": "circle", "colour": "red", "motion": "warp", "direction": "up"},
        {"shape": "circle", "colour": "red", "motion": "fast"},  # moving without direction
        {"shape": "circle", "colour": "red", "direction": "up"},  # still with a direction
        {"shape": "circle", "colour": "red", "motion": "slow", "direction": "north"},
    ],
)
def test_object_spec_rejects_bad_fields(kwargs):
    with pytest.raises(ValueError):
        ObjectSpec(**kwargs)


def test_clip_spec_rejects_bad_fields():
    red = ObjectSpec(shape="circle", colour="red")
    blue = ObjectSpec(shape="square", colour="blue")
    with pytest.raises(ValueError, match="1-3 objects"):
        ClipSpec(objects=())
    with pytest.raises(ValueError, match="1-3 objects"):
        ClipSpec(
            objects=(
                red,
                blue,
                *(ObjectSpec(shape="circle", colour=c) for c in ["green", "white"]),
            )
        )
    with pytest.raises(ValueError, match="distinct"):
        ClipSpec(objects=(red, dataclasses.replace(red, shape="square")))
    with pytest.raises(ValueError, match="pan"):
        ClipSpec(objects=(red,), pan="sideways")
    with pytest.raises(ValueError):
        sample_spec(0, min_objects=2, max_objects=1)
    with pytest.raises(ValueError):
        sample_spec(0, pan_probability=1.5)


def test_sample_spec_is_deterministic_and_varied():
    assert sample_spec(7) == sample_spec(7)
    assert sample_spec(np.random.default_rng(7)) == sample_spec(7)
    specs = [sample_spec(i) for i in range(200)]
    assert len(set(specs)) == 200
    counts = {n: sum(len(s.objects) == n for s in specs) for n in (1, 2, 3)}
    assert all(c > 30 for c in counts.values()), counts
    objects = [o for s in specs for o in s.objects]
    assert {o.shape for o in objects} == set(shapes.SHAPES)
    assert {o.motion for o in objects} == set(shapes.MOTIONS)
    assert {o.colour for o in objects} == set(PALETTE)
    assert {s.pan for s in specs} == set(shapes.PANS)
    assert 0.15 < np.mean([s.pan != "none" for s in specs]) < 0.45


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("size", [(17, 64, 64), (33, 48, 80), (5, 128, 128), (300, 32, 32)])
def test_render_shape_range_and_determinism(size):
    t, h, w = size
    spec = sample_spec(3)
    frames, paths = render(spec, t, h, w)
    assert frames.shape == (t, h, w, 3) and frames.dtype == np.float32
    assert paths.shape == (len(spec.objects), t, 2)
    assert frames.min() >= -1.0 and frames.max() <= 1.0
    again, _ = render(spec, t, h, w)
    np.testing.assert_array_equal(frames, again)
    other, _ = render(sample_spec(4), t, h, w)
    assert not np.array_equal(frames, other)


def test_render_rejects_bad_sizes():
    with pytest.raises(ValueError):
        render(sample_spec(0), 0)
    with pytest.raises(ValueError):
        render(sample_spec(0), 5, 8, 64)


def test_object_interiors_are_exact_palette_colours_and_background_is_far():
    palette = np.asarray(list(PALETTE.values()))
    for seed in range(20):
        spec = sample_spec(seed)
        frames, paths = render(spec, 9)
        for obj in spec.objects:
            assert _colour_mask(frames, obj.colour, 1e-5).any(axis=(1, 2)).all()
        # Pixels near a palette colour all lie on an object: the background never is.
        dist = np.linalg.norm((frames[..., None, :] + 1) / 2 - palette, axis=-1).min(-1)
        t, y, x = np.nonzero(dist < 0.45)
        near = np.zeros(len(t), bool)
        for obj, path in zip(spec.objects, paths, strict=True):
            left, right, top, bottom = extent(obj.shape, obj.size * 64)
            reach = np.hypot(max(left, right), max(top, bottom)) + 1
            near |= np.hypot(x + 0.5 - path[t, 0], y + 0.5 - path[t, 1]) <= reach
        assert near.all()


def test_trajectories_match_rendered_centroids():
    for seed in range(30):
        spec = sample_spec(seed, max_objects=1)
        frames, paths = render(spec, 33)
        np.testing.assert_array_equal(paths, trajectories(spec, 33))
        found = _centroids(_colour_mask(frames, spec.objects[0].colour))
        np.testing.assert_allclose(found, paths[0], atol=0.75)


def test_objects_bounce_and_stay_inside_the_frame():
    """Over a long clip every object stays whole and inside, and reverses at the walls."""
    for seed in range(12):
        spec = sample_spec(seed, max_objects=1, pan_probability=0.5)
        obj = spec.objects[0]
        t = 400
        frames, paths = render(spec, t, 48, 64)
        left, right, top, bottom = extent(obj.shape, obj.size * 48)
        assert (paths[0, :, 0] - left >= -1e-6).all() and (
            paths[0, :, 0] + right <= 64 + 1e-6
        ).all()
        assert (paths[0, :, 1] - top >= -1e-6).all() and (
            paths[0, :, 1] + bottom <= 48 + 1e-6
        ).all()
        area = _colour_mask(frames, obj.colour).sum((1, 2))
        assert area.min() > 0.8 * np.median(area)  # never cut by a wall (pixel quantisation: ~10%)
        # On-screen speed is |own - camera| in every frame away from a bounce.
        step = np.linalg.norm(np.diff(paths[0], axis=0), axis=-1) / 48
        want = np.linalg.norm(np.subtract(obj.velocity, spec.camera_velocity))
        assert np.median(np.abs(step - want)) < 1e-9
        if want * t * 48 > 2 * 64:  # it crossed the frame at least once, so it bounced
            v = np.diff(paths[0], axis=0)
            assert any((v[1:, a] * v[:-1, a] < 0).any() for a in range(2))


@pytest.mark.parametrize("prompt", [p for p in EVAL_PROMPTS if p.category == "bouncing"], ids=str)
def test_bouncing_prompts_reverse_within_17_frames(prompt):
    paths = trajectories(prompt.spec, 17)
    v = np.diff(paths[0], axis=0)
    flips = [(np.sign(v[1:, a]) * np.sign(v[:-1, a]) < 0).any() for a in range(2)]
    assert any(flips)


def test_pan_moves_background_and_objects_together():
    obj = ObjectSpec(shape="square", colour="white", size=0.08, position=(0.3, 0.2))
    shift = 25  # frames: PAN_SPEED * 64 * 25 = 8 px exactly
    assert PAN_SPEED * 64 * shift == pytest.approx(8.0)
    for pan, (dx, dy) in {"left": (8, 0), "right": (-8, 0), "up": (0, 8), "down": (0, -8)}.items():
        spec = ClipSpec(objects=(obj,), pan=pan, seed=5)
        frames, paths = render(spec, shift + 1)
        np.testing.assert_allclose(paths[0, shift] - paths[0, 0], (dx, dy), atol=1e-6)
        # Content moves by (dx, dy): frames[s][y + dy, x + dx] == frames[0][y, x]. Compare a
        # region away from the object.
        a = frames[0, 24:48, 24:48]
        b = frames[shift, 24 + dy : 48 + dy, 24 + dx : 48 + dx]
        np.testing.assert_allclose(a, b, atol=1e-4)
        assert np.abs(frames[shift, 32:56, 32:56] - frames[0, 32:56, 32:56]).mean() > 0.01
    still, _ = render(ClipSpec(objects=(obj,), seed=5), 10)
    np.testing.assert_array_equal(still[0], still[-1])


# --------------------------------------------------------------------------- captions


def _expected(spec: ClipSpec) -> list[CaptionObject]:
    return [CaptionObject(o.colour, o.shape, o.motion, o.direction) for o in spec.objects]


def test_caption_round_trips_for_sampled_specs():
    for seed in range(300):
        spec = sample_spec(seed)
        text = caption(spec)
        assert parse_caption(text) == _expected(spec), text
        assert parse_pan(text) == spec.pan


def test_caption_round_trips_for_eval_prompts():
    for prompt in EVAL_PROMPTS:
        assert parse_caption(prompt.caption) == _expected(prompt.spec)
        assert parse_pan(prompt.caption) == prompt.spec.pan


def test_caption_wording():
    spec = ClipSpec(
        objects=(
            ObjectSpec(shape="circle", colour="red", motion="fast", direction="left"),
            ObjectSpec(shape="square", colour="blue", position=(0.2, 0.2)),
        ),
        pan="right",
    )
    assert caption(spec) == (
        "a red circle bouncing fast to the left, a blue square standing still, camera panning right"
    )


def test_parse_caption_accepts_free_wording():
    got = parse_caption(
        "A Yellow Triangle moving quickly to the top left and a green square that is static; "
        "one magenta circle drifting slowly downward"
    )
    assert got == [
        CaptionObject("yellow", "triangle", "fast", "up-left"),
        CaptionObject("green", "square", "still", None),
        CaptionObject("magenta", "circle", "slow", "down"),
    ]
    assert parse_caption("a white circle") == [CaptionObject("white", "circle", None, None)]
    assert parse_pan("The camera pans left") == "left"
    assert parse_pan("a white circle") == "none"


@pytest.mark.parametrize("text", ["", "camera panning left", "a purple circle", "a red hexagon"])
def test_parse_caption_rejects_unknown_objects(text):
    with pytest.raises(ValueError):
        parse_caption(text)


# --------------------------------------------------------------------------- eval prompts


def test_eval_prompts_cover_the_categories():
    assert len(EVAL_PROMPTS) >= 32
    categories = {p.category for p in EVAL_PROMPTS}
    assert categories == {"static", "slow", "fast", "bouncing", "multi", "pan"}
    assert len({p.name for p in EVAL_PROMPTS}) == len(EVAL_PROMPTS)
    assert len({p.caption for p in EVAL_PROMPTS}) == len(EVAL_PROMPTS)
    assert len({p.seed for p in EVAL_PROMPTS}) == len(EVAL_PROMPTS)
    for p in EVAL_PROMPTS:
        motions = {o.motion for o in p.spec.objects}
        if p.category == "static":
            assert motions == {"still"} and p.spec.pan == "none"
        if p.category in ("slow", "fast"):
            assert p.category in motions
        if p.category == "multi":
            assert len(p.spec.objects) >= 2
        if p.category == "pan":
            assert p.spec.pan != "none"
    assert {SPEED[o.motion] for p in EVAL_PROMPTS for o in p.spec.objects} == set(SPEED.values())


def test_eval_prompt_objects_never_overlap_in_33_frames():
    for p in EVAL_PROMPTS:
        paths = trajectories(p.spec, 33)
        objs = p.spec.objects
        for i in range(len(objs)):
            for j in range(i + 1, len(objs)):
                ei = np.asarray(extent(objs[i].shape, objs[i].size * 64))
                ej = np.asarray(extent(objs[j].shape, objs[j].size * 64))
                gap_x = np.maximum(
                    (paths[j, :, 0] - ej[0]) - (paths[i, :, 0] + ei[1]),
                    (paths[i, :, 0] - ei[0]) - (paths[j, :, 0] + ej[1]),
                )
                gap_y = np.maximum(
                    (paths[j, :, 1] - ej[2]) - (paths[i, :, 1] + ei[3]),
                    (paths[i, :, 1] - ei[2]) - (paths[j, :, 1] + ej[3]),
                )
                assert (np.maximum(gap_x, gap_y) > 1.0).all(), p.name


def test_random_eval_prompts_are_deterministic_in_the_seed():
    a = shapes.random_eval_prompts(6, seed=7)
    assert a == shapes.random_eval_prompts(6, seed=7)
    assert shapes.random_eval_prompts(3, seed=7) == a[:3]  # a larger n extends a smaller one
    b = shapes.random_eval_prompts(6, seed=8)
    assert all(p.spec != q.spec for p, q in zip(a, b, strict=True))
    assert [p.seed for p in a] == list(range(7, 13))
    assert len({p.name for p in a + b}) == 12
    assert all(p.category == shapes.categorise(p.spec) for p in a)
    # Fresh draws: never the training stream's clips (seed 0 is the stages' default seed).
    config = LoaderConfig(batch_size=1, num_frames=1)
    training = [clip_at(config, 0, i)[0] for i in range(4)]
    assert not set(training) & {p.spec for p in shapes.random_eval_prompts(4, seed=0)}


@pytest.mark.parametrize("n, seed", [(0, 0), (-1, 0), (2, -1)])
def test_random_eval_prompts_reject_bad_input(n, seed):
    with pytest.raises(ValueError, match="must be >= "):
        shapes.random_eval_prompts(n, seed)


@pytest.mark.parametrize(
    "objects, pan, category",
    [
        ((ObjectSpec(shape="circle", colour="red"),), "none", "static"),
        (
            (ObjectSpec(shape="square", colour="red", motion="slow", direction="up"),),
            "none",
            "slow",
        ),
        (
            (ObjectSpec(shape="circle", colour="red", motion="fast", direction="left"),),
            "none",
            "fast",
        ),
        ((ObjectSpec(shape="circle", colour="red"),), "left", "pan"),
        (
            (ObjectSpec(shape="circle", colour="red"), ObjectSpec(shape="square", colour="blue")),
            "none",
            "multi",
        ),
        (
            (ObjectSpec(shape="circle", colour="red"), ObjectSpec(shape="square", colour="blue")),
            "up",
            "multi",  # object count comes before the pan
        ),
    ],
)
def test_categorise_crafted_specs(objects, pan, category):
    assert shapes.categorise(ClipSpec(objects=objects, pan=pan)) == category


def test_canonical_caption_reads_free_phrasings_into_the_training_grammar():
    from vidax.data.shapes import canonical_caption

    for seed in range(300):  # the training captions are fixed points
        text = caption(sample_spec(np.random.default_rng(seed)))
        assert canonical_caption(text) == text
    cases = {
        "a red square moving right": "a red square bouncing slowly to the right",
        "A Blue Square Moving Left": "a blue square bouncing slowly to the left",
        "a green triangle moves quickly to the upper left and a red circle is static": (
            "a green triangle bouncing fast to the upper left, a red circle standing still"
        ),
        "camera pans left, a white square drifting down": (
            "a white square bouncing slowly downward, camera panning left"
        ),
        # Nothing to read without guessing: a bounce with no direction stays as written...
        "a red circle bouncing": "a red circle bouncing",
        # ... and a clause naming no known object leaves the whole prompt as written.
        "a red circle moving right, a dog running": "a red circle moving right, a dog running",
        "a cat": "a cat",
    }
    for text, expected in cases.items():
        assert canonical_caption(text) == expected
