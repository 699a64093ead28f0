"""The on-device renderer (`vidax.data.scene_render`) against the numpy reference (`shapes`)."""

import math

import jax
import numpy as np
import pytest

from vidax.data import scene_render, shapes
from vidax.data.scene_render import (
    CAPTION_VOCAB,
    caption_embeddings,
    caption_ids,
    render,
    sample_scenes,
    scenes_from_specs,
    specs_from_scenes,
)
from vidax.data.shapes import EVAL_PROMPTS, PALETTE, ClipSpec, ObjectSpec, caption
from vidax.text.hashed import HashedTextEmbedder

# Measured maxima (these specs and 200 more sampled, <= 33 frames): object edges 3.6e-5, from
# trajectories in float32 here and float64 in numpy (1.7e-5 px at 33 frames; it grows with t, to
# 1.2e-4 at 300 frames); background 1.4e-6, from the texture in float32 vs float64.
PIXEL_ATOL = 5e-5
BACKGROUND_ATOL = 3e-6
PATH_ATOL = 5e-5  # pixels
# Word vector and position code are summed in float32 here, in float64 by the embedder: within
# ~1.5 ulp of entries below 8 (measured 2.4e-7 here, 4.8e-7 over 235 captions at dim 256).
EMBED_ATOL = 1e-6

_OVERLAPPING = ClipSpec(  # slot order decides what is on top
    objects=(
        ObjectSpec(shape="square", colour="white", size=0.2, position=(0.5, 0.5)),
        ObjectSpec(shape="circle", colour="red", size=0.1, position=(0.58, 0.5)),
        ObjectSpec(
            shape="triangle",
            colour="blue",
            size=0.08,
            position=(0.45, 0.5),
            motion="slow",
            direction="up-left",
        ),
    ),
    pan="up",
    seed=3,
)
SPECS = [shapes.sample_spec(i) for i in range(30)] + [p.spec for p in EVAL_PROMPTS] + [_OVERLAPPING]


@pytest.fixture(scope="module")
def scenes():
    return scenes_from_specs(SPECS)


@pytest.fixture(scope="module")
def sampled():
    return jax.tree.map(np.asarray, sample_scenes(jax.random.key(0), 4096))


def _numpy_frames(specs, t, h, w):
    return np.stack([shapes.render(s, t, h, w)[0] for s in specs])


# --------------------------------------------------------------------------- rendering


# Every size and every frame count (1, 9, 33) once; sizes cached by jit for the tests below.
@pytest.mark.parametrize("size", [(33, 64, 64), (1, 32, 32), (9, 48, 48), (33, 48, 64)])
def test_render_matches_numpy(scenes, size):
    t, h, w = size
    assert any(s.pan != "none" for s in SPECS)
    got = np.asarray(render(scenes, t, h, w))
    assert got.shape == (len(SPECS), t, h, w, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, _numpy_frames(SPECS, t, h, w), rtol=0, atol=PIXEL_ATOL)
    paths = np.asarray(scene_render.trajectories(scenes, t, h, w))
    for i, spec in enumerate(SPECS):
        want = shapes.trajectories(spec, t, h, w)
        np.testing.assert_allclose(paths[i, : len(spec.objects)], want, rtol=0, atol=PATH_ATOL)


def test_background_matches_numpy_and_absent_slots_draw_nothing(scenes):
    t, h, w = 33, 48, 64
    empty = scenes._replace(present=np.zeros_like(scenes.present))
    got = np.asarray(render(empty, t, h, w))
    want = np.stack([shapes._background(s, t, h, w) for s in SPECS])
    np.testing.assert_allclose(got, want, rtol=0, atol=BACKGROUND_ATOL)
    # Junk in the unused slots changes nothing.
    on = scenes.present
    junk = scenes._replace(
        shape=np.where(on, scenes.shape, 2),
        colour=np.where(on, scenes.colour, 4),
        size=np.where(on, scenes.size, np.float32(0.25)),
    )
    assert not on.all()
    np.testing.assert_array_equal(
        np.asarray(render(junk, t, h, w)), np.asarray(render(scenes, t, h, w))
    )


def test_later_slots_draw_on_top(scenes):
    unit = (np.asarray(render(scenes, 1, 64, 64))[-1, 0] + 1) / 2  # _OVERLAPPING
    # (row, col): square only; circle over square; triangle over square; triangle over circle.
    want = {(22, 32): "white", (32, 37): "red", (32, 28): "blue", (34, 33): "blue"}
    for (row, col), colour in want.items():
        np.testing.assert_allclose(unit[row, col], PALETTE[colour], atol=1e-6)


def test_render_vmaps_over_a_leading_axis(scenes):
    pairs = jax.tree.map(lambda x: x[:8].reshape(2, 4, *x.shape[1:]), scenes)
    got = np.asarray(jax.vmap(lambda s: render(s, 1, 32, 32))(pairs))
    np.testing.assert_array_equal(got.reshape(8, 1, 32, 32, 3), render(scenes, 1, 32, 32)[:8])


# --------------------------------------------------------------------------- captions


def test_caption_vocab_covers_the_grammar():
    assert len(set(CAPTION_VOCAB)) == len(CAPTION_VOCAB)
    words = {w for s in SPECS for w in HashedTextEmbedder.words(caption(s))}
    assert words <= set(CAPTION_VOCAB)
    assert {"upper", "lower", "upward", "downward", "camera", "panning"} <= set(CAPTION_VOCAB)


@pytest.mark.parametrize("text_len", [1, 7, 40])
def test_caption_ids_round_trip(scenes, text_len):
    ids, mask = caption_ids(scenes, text_len)
    ids, mask = np.asarray(ids), np.asarray(mask)
    assert ids.shape == mask.shape == (len(SPECS), text_len) and ids.dtype == np.int32
    for i, spec in enumerate(SPECS):
        want = HashedTextEmbedder.words(caption(spec))[:text_len]
        assert [CAPTION_VOCAB[j] for j in ids[i][mask[i]]] == want
        assert mask[i].tolist() == [k < len(want) for k in range(text_len)]


@pytest.mark.parametrize("dim, text_len", [(64, 32), (32, 7)])
def test_caption_embeddings_match_embedder(scenes, dim, text_len):
    embedder = HashedTextEmbedder(dim=dim, text_len=text_len)
    got, mask = caption_embeddings(scenes, embedder)
    want, want_mask = embedder([caption(s) for s in SPECS])
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(mask), want_mask)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=EMBED_ATOL)


# --------------------------------------------------------------------------- sampling


def test_sample_scenes_distribution(sampled):
    s, n = sampled, len(sampled.pan)
    assert s.shape.shape == (n, 3) and s.position.dtype == np.float32 and s.pan.dtype == np.int32
    count = s.present.sum(1)
    np.testing.assert_array_equal(s.present, np.arange(3) < count[:, None])  # a prefix of slots
    # Frequencies within ~4 standard deviations of the intended ones.
    np.testing.assert_allclose(np.bincount(count, minlength=4)[1:] / n, 1 / 3, atol=0.03)
    on = s.present
    for field, k in (("shape", 3), ("motion", 3), ("colour", 6)):
        freq = np.bincount(getattr(s, field)[on], minlength=k) / on.sum()
        np.testing.assert_allclose(freq, 1 / k, atol=0.025, err_msg=field)
    moving = on & (s.motion > 0)
    np.testing.assert_allclose(np.bincount(s.direction[moving]) / moving.sum(), 1 / 8, atol=0.02)
    assert (s.direction[on & (s.motion == 0)] == 0).all()
    for i in range(n):
        colours = s.colour[i][on[i]]
        assert len(set(colours.tolist())) == len(colours)
    np.testing.assert_allclose(np.bincount(s.pan, minlength=5) / n, [0.7] + [0.075] * 4, atol=0.03)
    assert (s.size >= 0.085).all() and (s.size <= 0.14).all()
    margin = np.max(scene_render._EXTENTS[s.shape], -1) * s.size + 0.02
    assert (s.position >= margin[..., None] - 1e-6).all()
    assert (s.position <= 1 - margin[..., None] + 1e-6).all()
    # Texture parameters in _texture_params' ranges.
    assert np.allclose(s.tint.max(1), 1) and (s.tint >= 0.55).all()
    assert (s.base >= 0.16).all() and (s.base <= 0.24).all()
    assert (s.freqs >= 1.5 * 2 * math.pi - 1e-5).all() and (s.freqs <= 4 * 2 * math.pi).all()
    for x in (s.angles, s.phases):
        assert (x >= 0).all() and (x <= 2 * math.pi).all()
    assert (s.wave_tint >= 0.5).all() and (s.wave_tint <= 1).all()

    # Non-overlap as sample_spec achieves it: compare the share of clips with a touching pair.
    def touching(specs):
        pairs = [[(a, b) for j, b in enumerate(c.objects) for a in c.objects[:j]] for c in specs]
        return np.mean([any(not shapes._apart(b.position, b.size, a) for a, b in p) for p in pairs])

    ours = touching(specs_from_scenes(jax.tree.map(lambda x: x[:1000], s)))
    theirs = touching([shapes.sample_spec(i) for i in range(1000)])
    assert abs(ours - theirs) < 0.03, (ours, theirs)


def test_sample_scenes_options_and_jit_inside_a_step():
    @jax.jit
    def step(key):  # as a train step draws its clips
        s = sample_scenes(key, 64, min_objects=2, max_objects=2, pan_probability=1.0)
        return s, render(s, 1, 32, 32)

    (s, video), (t, _) = step(jax.random.key(1)), step(jax.random.key(2))
    assert video.shape == (64, 1, 32, 32, 3)
    assert (np.asarray(s.present).sum(1) == 2).all() and (np.asarray(s.pan) > 0).all()
    assert not np.array_equal(s.position, t.position)


def test_sampled_scenes_are_valid_specs_that_numpy_renders_the_same(sampled, monkeypatch):
    n = len(SPECS)  # a batch size already compiled above
    s = jax.tree.map(lambda x: x[:n], sampled)
    specs = specs_from_scenes(s)
    assert len(specs) == n and all(isinstance(c, ClipSpec) for c in specs)  # validated fields
    got = np.asarray(render(s, 9, 48, 48))
    ids, mask = caption_ids(s, 40)
    a = s
    for i, spec in enumerate(specs):
        # specs carry seed 0; draw them over the scene's own background parameters instead.
        fields = shapes._TextureParams._fields
        params = shapes._TextureParams(*(np.float64(getattr(a, f)[i]) for f in fields))
        monkeypatch.setattr(shapes, "_texture_params", lambda seed, p=params: p)
        want, _ = shapes.render(spec, 9, 48, 48)
        np.testing.assert_allclose(got[i], want, rtol=0, atol=PIXEL_ATOL)
        words = [CAPTION_VOCAB[j] for j in np.asarray(ids[i])[np.asarray(mask[i])]]
        assert words == HashedTextEmbedder.words(caption(spec))
    monkeypatch.undo()
    back = scenes_from_specs(specs)
    for field in ("present", "shape", "colour", "size", "position", "motion", "direction", "pan"):
        x, y = getattr(back, field), getattr(a, field)
        on = a.present if x.ndim > 1 else np.ones(n, bool)
        np.testing.assert_array_equal(x[on], y[on], err_msg=field)


# --------------------------------------------------------------------------- bad input


def test_bad_arguments_raise(scenes):
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="n must be"):
        sample_scenes(key, 0)
    with pytest.raises(ValueError, match="min_objects"):
        sample_scenes(key, 4, min_objects=3, max_objects=2)
    with pytest.raises(ValueError, match="min_objects"):
        sample_scenes(key, 4, max_objects=4)
    with pytest.raises(ValueError, match="pan_probability"):
        sample_scenes(key, 4, pan_probability=1.5)
    with pytest.raises(ValueError, match="num_frames"):
        render(scenes, 0)
    with pytest.raises(ValueError, match="16x16"):
        render(scenes, 5, 8, 64)
    with pytest.raises(ValueError, match=r"Scenes\.present"):
        render(scenes._replace(present=scenes.present[:, :2]), 5)
    with pytest.raises(ValueError, match="text_len"):
        caption_ids(scenes, 0)
    with pytest.raises(ValueError, match="at least one"):
        scenes_from_specs([])
