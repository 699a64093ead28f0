"""Finding the palette objects of `vidax.data.shapes` clips in a video, without learned models.

Pixels are labelled with their nearest palette colour when it is within `threshold` (RGB
distance on the [0, 1] scale); everything else is background. Same-colour 4-connected pixels of
one frame form a blob, classified as the ideal shape it overlaps most: each of circle, square
and triangle is drawn (anti-aliased, as `vidax.data.render` draws it) with the blob's area at
the blob's centroid, and the shape covering most of the blob wins (highest IoU, since the
areas are equal). That reads blurred outlines the way a person would: a square whose corners
a decoder rounded is still closer to a square than to a circle. A clip's objects have distinct
colours, so a track is simply the largest blob of one colour in each frame.

All functions take videos (t, h, w, 3) in [-1, 1], the range `vidax.data.render` produces.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vidax.data.shapes import PALETTE, SHAPES, signed_distance

COLOURS = tuple(PALETTE)
_PALETTE = np.asarray([PALETTE[c] for c in COLOURS], np.float32)  # (k, 3) in [0, 1]
DEFAULT_THRESHOLD = 0.3


def as_unit_video(video) -> np.ndarray:
    """A video (t, h, w, 3) in [-1, 1] (numpy or jax) as float32 in [0, 1].

    Values slightly outside [-1, 1] (model outputs) are clipped.

    Raises:
        ValueError: for a wrong shape, or values far outside [-1, 1] (e.g. uint8 frames).
    """
    x = np.asarray(video, dtype=np.float32)
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"expected a video (t, h, w, 3), got shape {x.shape}")
    if x.size and (np.nanmax(x) > 1.5 or np.nanmin(x) < -1.5):
        raise ValueError(
            f"expected values in [-1, 1], got [{np.nanmin(x):.3g}, {np.nanmax(x):.3g}]"
        )
    return np.clip((x + 1.0) * 0.5, 0.0, 1.0)


def palette_labels(video, *, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Nearest palette colour per pixel.

    Args:
        video: (t, h, w, 3) in [-1, 1].
        threshold: largest RGB distance (on the [0, 1] scale) from a palette colour.

    Returns:
        (t, h, w) int8: index into `COLOURS`, or -1 for background.
    """
    x = as_unit_video(video)
    # |x - p|^2 = |x|^2 - 2 x.p + |p|^2; the |x|^2 term does not change the argmin.
    cross = x @ _PALETTE.T  # (t, h, w, k)
    dist2 = (x * x).sum(-1, keepdims=True) - 2.0 * cross + (_PALETTE * _PALETTE).sum(-1)
    nearest = dist2.argmin(-1)
    best = np.take_along_axis(dist2, nearest[..., None], -1)[..., 0]
    return np.where(best <= threshold * threshold, nearest, -1).astype(np.int8)


@dataclasses.dataclass(frozen=True)
class Blobs:
    """Connected same-colour components of a video, one row per blob (n blobs).

    Attributes:
        frame: (n,) frame index.
        colour: (n,) index into `COLOURS`.
        area: (n,) pixel count.
        centroid: (n, 2) mean pixel centre (x, y) in pixels (pixel (i, j) is at (j+.5, i+.5)).
        bbox: (n, 4) inclusive pixel box (x0, y0, x1, y1).
        shape: (n,) index into `SHAPES`: the ideal shape that overlaps the blob most.
    """

    frame: np.ndarray
    colour: np.ndarray
    area: np.ndarray
    centroid: np.ndarray
    bbox: np.ndarray
    shape: np.ndarray

    @property
    def fill(self) -> np.ndarray:
        """(n,) area / bounding-box area."""
        box = (self.bbox[:, 2] - self.bbox[:, 0] + 1) * (self.bbox[:, 3] - self.bbox[:, 1] + 1)
        return self.area / box


def _components(labels: np.ndarray) -> np.ndarray:
    """Connected-component roots (t, h, w) int64: the smallest flat index in each blob.

    4-connectivity within a frame, between pixels of the same colour; -1 for background.
    Min-label propagation with pointer jumping: each sweep takes the neighbours' minimum,
    then every pixel jumps to its root's root, so blobs converge in a few sweeps.
    """
    mask = labels >= 0
    n = labels.size
    root = np.where(mask, np.arange(n).reshape(labels.shape), n)
    sentinel = np.int64(n)
    while True:
        new = root.copy()
        for axis in (1, 2):
            lo, hi = [slice(None)] * 3, [slice(None)] * 3
            lo[axis], hi[axis] = slice(1, None), slice(None, -1)
            a, b = tuple(lo), tuple(hi)
            same = mask[a] & (labels[a] == labels[b])
            np.minimum(new[a], np.where(same, root[b], sentinel), out=new[a])
            np.minimum(new[b], np.where(same, root[a], sentinel), out=new[b])
        flat = new.reshape(-1)
        inside = flat < n
        for _ in range(4):
            flat[inside] = flat[flat[inside]]
        if np.array_equal(new, root):
            break
        root = new
    return np.where(mask, root, -1)


def find_blobs(
    video, *, threshold: float = DEFAULT_THRESHOLD, min_area: int | None = None
) -> Blobs:
    """Every palette-coloured blob of every frame.

    Args:
        video: (t, h, w, 3) in [-1, 1].
        threshold: palette distance threshold (see `palette_labels`).
        min_area: smallest blob in pixels; default max(4, h*w/1000) drops speckle.

    Returns:
        `Blobs`, ordered by frame.
    """
    labels = palette_labels(video, threshold=threshold)
    _, h, w = labels.shape
    min_area = max(4, (h * w) // 1000) if min_area is None else min_area
    roots = _components(labels).reshape(-1)
    pixels = np.flatnonzero(roots >= 0)
    uniq, inverse, counts = np.unique(roots[pixels], return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.cumsum(counts) - counts
    sorted_pixels = pixels[order]
    ys = (sorted_pixels // w) % h
    xs = sorted_pixels % w

    def reduce(ufunc, values):
        return ufunc.reduceat(values, starts) if len(starts) else values[:0]

    keep = counts >= min_area
    fx = reduce(np.add, xs + 0.5) / np.maximum(counts, 1)
    fy = reduce(np.add, ys + 0.5) / np.maximum(counts, 1)
    bbox = np.stack(
        [
            reduce(np.minimum, xs),
            reduce(np.minimum, ys),
            reduce(np.maximum, xs),
            reduce(np.maximum, ys),
        ],
        axis=-1,
    ).reshape(-1, 4)
    return Blobs(
        frame=(uniq // (h * w))[keep],
        colour=labels.reshape(-1)[uniq][keep].astype(np.int64),
        area=counts[keep],
        centroid=np.stack([fx, fy], axis=-1).reshape(-1, 2)[keep],
        bbox=bbox[keep],
        shape=_classify(xs, ys, counts, fx, fy)[keep],
    )


def _classify(
    xs: np.ndarray, ys: np.ndarray, counts: np.ndarray, fx: np.ndarray, fy: np.ndarray
) -> np.ndarray:
    """(n,) index into `SHAPES` of the ideal shape that covers most of each blob.

    Args:
        xs, ys: pixel coordinates of all blobs, blob after blob.
        counts: (n,) pixels per blob; fx, fy: (n,) blob centroids in pixels.
    """
    if not len(counts):
        return counts.astype(np.int64)
    blob = np.repeat(np.arange(len(counts)), counts)
    dx, dy = xs + 0.5 - fx[blob], ys + 0.5 - fy[blob]
    radius = np.sqrt(counts / np.pi)[blob]
    overlap = np.stack(
        [
            np.bincount(
                blob,
                weights=np.clip(0.5 - signed_distance(shape, dx, dy, radius), 0.0, 1.0),
                minlength=len(counts),
            )
            for shape in SHAPES
        ],
        axis=-1,
    )
    return overlap.argmax(-1).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Track:
    """One colour followed through a video: its largest blob in each frame.

    Attributes:
        colour: a `PALETTE` name.
        present: (t,) bool, whether a blob of this colour was found.
        centroid: (t, 2) (x, y) in pixels; NaN where absent.
        area: (t,) pixels; 0 where absent.
        bbox: (t, 4) inclusive (x0, y0, x1, y1); -1 where absent.
        shape: (t,) index into `SHAPES`; -1 where absent.
    """

    colour: str
    present: np.ndarray
    centroid: np.ndarray
    area: np.ndarray
    bbox: np.ndarray
    shape: np.ndarray

    @property
    def presence(self) -> float:
        """Fraction of frames in which the object was found."""
        return float(self.present.mean())

    @property
    def majority_shape(self) -> str | None:
        """The most frequent shape class, None if never present."""
        if not self.present.any():
            return None
        return SHAPES[int(np.bincount(self.shape[self.present], minlength=3).argmax())]


@dataclasses.dataclass(frozen=True)
class Tracks:
    """All colour tracks of a video plus its frame geometry."""

    tracks: dict[str, Track]
    num_frames: int
    height: int
    width: int

    def __getitem__(self, colour: str) -> Track:
        return self.tracks[colour]

    def __contains__(self, colour: str) -> bool:
        return colour in self.tracks

    def objects(self, min_presence: float = 0.1) -> list[Track]:
        """Tracks found in at least `min_presence` of the frames (the video's objects)."""
        return [tr for tr in self.tracks.values() if tr.presence >= min_presence]


def track_objects(
    video, *, threshold: float = DEFAULT_THRESHOLD, min_area: int | None = None
) -> Tracks:
    """Follows every palette colour through the video (largest blob per frame).

    Args:
        video: (t, h, w, 3) in [-1, 1].
        threshold, min_area: see `find_blobs`.

    Returns:
        `Tracks` with one `Track` per colour seen in at least one frame.
    """
    x = as_unit_video(video)
    t, h, w, _ = x.shape
    blobs = find_blobs(video, threshold=threshold, min_area=min_area)
    tracks = {}
    for k in np.unique(blobs.colour):
        sel = np.flatnonzero(blobs.colour == k)
        # Largest blob per frame: sort by (frame, -area) and keep each frame's first.
        sel = sel[np.lexsort((-blobs.area[sel], blobs.frame[sel]))]
        frames, first = np.unique(blobs.frame[sel], return_index=True)
        best = sel[first]
        present = np.zeros(t, bool)
        present[frames] = True
        centroid = np.full((t, 2), np.nan)
        centroid[frames] = blobs.centroid[best]
        area = np.zeros(t, np.int64)
        area[frames] = blobs.area[best]
        bbox = np.full((t, 4), -1, np.int64)
        bbox[frames] = blobs.bbox[best]
        shape = np.full(t, -1, np.int64)
        shape[frames] = blobs.shape[best]
        colour = COLOURS[int(k)]
        tracks[colour] = Track(colour, present, centroid, area, bbox, shape)
    return Tracks(tracks, t, h, w)
