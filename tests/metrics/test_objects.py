import numpy as np
import pytest

from vidax.data import SHAPES, ClipSpec, ObjectSpec, render, sample_spec
from vidax.metrics import COLOURS, find_blobs, palette_labels, track_objects


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("size", [0.07, 0.1, 0.15, 0.22])
def test_shapes_are_classified_at_every_size(shape, size):
    rng = np.random.default_rng(0)
    for colour in COLOURS:
        obj = ObjectSpec(
            shape=shape,
            colour=colour,
            size=size,
            position=tuple(rng.uniform(0.35, 0.65, 2)),
            motion="slow",
            direction="up-right",
        )
        frames, paths = render(ClipSpec(objects=(obj,), seed=int(rng.integers(100))), 8)
        blobs = find_blobs(frames)
        assert len(blobs.frame) == 8  # exactly one blob per frame
        assert set(blobs.colour.tolist()) == {COLOURS.index(colour)}
        assert [SHAPES[s] for s in blobs.shape] == [shape] * 8
        np.testing.assert_allclose(blobs.centroid, paths[0], atol=0.75)
        area = np.pi * (size * 64) ** 2
        assert np.all(np.abs(blobs.area - area) < 0.25 * area)


def _blur(frames, sigma):
    """Separable Gaussian blur of (t, h, w, 3) frames over h and w (edge padding)."""
    radius = int(np.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    k /= k.sum()
    for axis in (1, 2):
        pad = [(0, 0)] * 4
        pad[axis] = (radius, radius)
        x = np.pad(frames, pad, mode="edge")
        frames = sum(
            w * np.take(x, np.arange(i, i + frames.shape[axis]), axis=axis) for i, w in enumerate(k)
        )
    return frames


@pytest.mark.parametrize("shape", SHAPES)
def test_blurred_outlines_keep_their_shape(shape):
    # A decoder softens edges and rounds corners; a person still tells a square from a circle,
    # and so must the classifier (the earlier bbox fill-ratio rule misread 4 of these 24
    # squares and 3 of the triangles).
    rng = np.random.default_rng(1)
    found = []
    for i in range(24):
        obj = ObjectSpec(
            shape=shape,
            colour=COLOURS[i % len(COLOURS)],
            size=float(rng.uniform(0.08, 0.16)),
            position=tuple(rng.uniform(0.3, 0.7, 2)),
        )
        frames, _ = render(ClipSpec(objects=(obj,), seed=i), 1)
        blobs = find_blobs(_blur(frames, sigma=1.2))
        assert len(blobs.frame) == 1
        found.append(SHAPES[blobs.shape[0]])
    assert found.count(shape) >= 23, found


def test_background_is_not_an_object():
    for seed in range(10):
        spec = sample_spec(seed)
        frames, _ = render(spec, 4)
        labels = palette_labels(frames)
        found = {COLOURS[k] for k in np.unique(labels) if k >= 0}
        assert found == {o.colour for o in spec.objects}
        tracks = track_objects(frames)
        assert {t.colour for t in tracks.objects()} == found
        for obj in spec.objects:
            track = tracks[obj.colour]
            assert track.present.all() or len(spec.objects) > 1  # may be occluded
            assert track.majority_shape == obj.shape


def test_components_split_separate_blobs_and_drop_speckle():
    video = np.full((2, 32, 32, 3), -0.6, np.float32)
    red = np.asarray([1.0, 0.15, 0.15], np.float32) * 2 - 1
    video[:, 2:8, 2:8] = red  # two separate red squares
    video[:, 20:30, 15:25] = red
    video[0, 15, 0] = red  # one red pixel of speckle
    blobs = find_blobs(video)
    assert sorted(blobs.area.tolist()) == [36, 36, 100, 100]
    assert set(blobs.shape.tolist()) == {SHAPES.index("square")}
    assert (blobs.bbox[blobs.area == 100] == [15, 20, 24, 29]).all()
    np.testing.assert_allclose(blobs.centroid[blobs.area == 100], [[20.0, 25.0]] * 2)
    # The track keeps the largest blob of the colour.
    track = track_objects(video)["red"]
    assert track.area.tolist() == [100, 100]
    # A diagonal touch is not a connection (4-connectivity).
    diag = np.full((1, 16, 16, 3), -0.6, np.float32)
    diag[0, 2:6, 2:6] = red
    diag[0, 6:10, 6:10] = red
    assert len(find_blobs(diag).area) == 2


def test_video_without_objects():
    video = np.full((3, 32, 32, 3), -0.5, np.float32)
    assert (palette_labels(video) == -1).all()
    assert len(find_blobs(video).area) == 0
    assert track_objects(video).objects() == []
