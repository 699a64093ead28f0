"""Scene-level proxies for VBench's subject consistency, motion and prompt-following dimensions.

They read the palette objects of a `vidax.data.shapes` clip (see `vidax.metrics.objects`) and
compare what they do with what the caption (or the `ClipSpec`) asked for. Videos are
(t, h, w, 3) in [-1, 1]. Distances and speeds are in units of min(h, w) (speeds per frame),
the units of `vidax.data.SPEED`, so the numbers do not depend on the resolution.

Every function takes an optional precomputed `tracks=track_objects(video)` so that `evaluate`
segments a video once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vidax.data.shapes import (
    DIRECTIONS,
    PAN_SPEED,
    SHAPES,
    SPEED,
    CaptionObject,
    ClipSpec,
    camera_velocity,
    extent,
    parse_caption,
    parse_pan,
    trajectories,
)
from vidax.metrics.objects import Track, Tracks, track_objects

# Tolerances, in min(h, w) per frame unless stated. The speed band of a motion class is its
# nominal speed +- the pan speed +- _SPEED_MARGIN; scores fall linearly to 0 over _SPEED_DECAY.
_SPEED_MARGIN = 0.25 * SPEED["slow"]
_SPEED_DECAY = 0.5 * SPEED["slow"]
_DRIFT_FREE, _DRIFT_DECAY = 0.02, 0.05  # still objects: allowed / failing wander from home
_MOVE_PX = 0.5  # a per-frame displacement below this (pixels) is centroid noise
_DIRECTION_FRAMES = 4  # frames used to read the initial direction
_SPEED_LAG = 4  # frames between the centroids a speed is read from


def _tracks(video, tracks: Tracks | None) -> Tracks:
    return track_objects(video) if tracks is None else tracks


def _expectations(caption_or_spec: str | ClipSpec) -> tuple[list[CaptionObject], str]:
    if isinstance(caption_or_spec, ClipSpec):
        objects = [
            CaptionObject(o.colour, o.shape, o.motion, o.direction) for o in caption_or_spec.objects
        ]
        return objects, caption_or_spec.pan
    if isinstance(caption_or_spec, str):
        return parse_caption(caption_or_spec), parse_pan(caption_or_spec)
    raise TypeError(f"expected a caption str or a ClipSpec, got {type(caption_or_spec).__name__}")


def _speed(track: Track, scale: int) -> float:
    """Median on-screen speed in min(h, w) per frame, NaN if it cannot be measured.

    Measured over a lag of up to 4 frames: thresholded blobs move in whole pixels, so
    single-frame steps of a sub-pixel or diagonal motion are quantised (a 0.3 px/frame pan
    reads as 0, a 1.8 + 1.8 px diagonal step as 2 + 2). A lag divides that error by 4; the
    median ignores the few windows that straddle a bounce.
    """
    lag = min(_SPEED_LAG, len(track.centroid) - 1)
    if lag < 1:
        return float("nan")
    centroid = _steady(track)
    d = np.linalg.norm(centroid[lag:] - centroid[:-lag], axis=-1) / (lag * scale)
    return float(np.nanmedian(d)) if np.isfinite(d).any() else float("nan")


def motion_magnitude(video, *, tracks: Tracks | None = None) -> float:
    """Mean over the video's objects of their median on-screen speed (a dynamic-degree proxy).

    Args:
        video: (t, h, w, 3) in [-1, 1], t >= 2.

    Returns:
        Speed in min(h, w) per frame, >= 0 (0 for a frozen video or one without objects).
        For reference `vidax.data.SPEED` is 0.014 (slow) and 0.04 (fast).
    """
    tr = _tracks(video, tracks)
    scale = min(tr.height, tr.width)
    speeds = [_speed(track, scale) for track in tr.objects()]
    speeds = [v for v in speeds if np.isfinite(v)]
    return float(np.mean(speeds)) if speeds else 0.0


@dataclasses.dataclass(frozen=True)
class SubjectScore:
    """One object's part of `subject_consistency`: score = presence x shape x area.

    Attributes:
        colour: the object's `PALETTE` colour.
        presence: share of frames it is found in.
        shape_agreement: share of those frames classified as its majority shape.
        area_stability: 1 - mean |area - median| / median over those frames, clipped at 0.
    """

    colour: str
    presence: float
    shape_agreement: float
    area_stability: float

    @property
    def score(self) -> float:
        return self.presence * self.shape_agreement * self.area_stability


def subject_scores(
    video, *, min_presence: float = 0.1, tracks: Tracks | None = None
) -> list[SubjectScore]:
    """The per-object terms `subject_consistency` averages (see there), for reading where a
    video loses it: an unasked colour, a shape that flips, or an object that grows and shrinks.

    Args:
        video: (t, h, w, 3) in [-1, 1].
        min_presence: share of frames a colour needs to count as an object.

    Returns:
        One `SubjectScore` per colour found in at least `min_presence` of the frames.
    """
    tr = _tracks(video, tracks)
    out = []
    for track in tr.objects(min_presence):
        present = track.present
        shapes = track.shape[present]
        agreement = np.bincount(shapes, minlength=len(SHAPES)).max() / len(shapes)
        area = track.area[present].astype(np.float64)
        median = np.median(area)
        area_stability = max(0.0, 1.0 - float(np.mean(np.abs(area - median)) / median))
        out.append(SubjectScore(track.colour, track.presence, float(agreement), area_stability))
    return out


def subject_consistency(video, *, min_presence: float = 0.1, tracks: Tracks | None = None) -> float:
    """How stable the video's objects are over time (VBench subject consistency, by hand).

    Each colour found in at least `min_presence` of the frames is an object. Its stability is
    presence x shape agreement x area stability, where presence is the share of frames it is
    found in (an object that changes colour splits into two half-present tracks), shape
    agreement the share of its frames classified as its majority shape, and area stability
    1 - mean |area - median| / median (clipped at 0). The score is the mean over objects
    (`subject_scores` gives the terms).

    Args:
        video: (t, h, w, 3) in [-1, 1].
        min_presence: share of frames a colour needs to count as an object (filters speckle).

    Returns:
        Score in [0, 1]: 1 for objects that keep colour, shape and size in every frame; 0 when
        no object is found. Higher is better.
    """
    scores = [s.score for s in subject_scores(video, min_presence=min_presence, tracks=tracks)]
    return float(np.mean(scores)) if scores else 0.0


def _speed_score(speed: float, motion: str, pan: str) -> float:
    nominal = SPEED[motion]
    pan_speed = PAN_SPEED if pan != "none" else 0.0
    lo = max(0.0, nominal - pan_speed) - _SPEED_MARGIN
    hi = nominal + pan_speed + _SPEED_MARGIN
    miss = max(0.0, lo - speed, speed - hi)
    return float(np.clip(1.0 - miss / _SPEED_DECAY, 0.0, 1.0))


def _fold(p: float, lo: float, hi: float) -> float:
    length = hi - lo
    if length <= 0:
        return (lo + hi) / 2
    u = (p - lo) % (2 * length)
    return lo + (u if u <= length else 2 * length - u)


def _steady(track: Track) -> np.ndarray:
    """(t, 2) centroids of the frames where the whole object is seen, NaN elsewhere.

    A frame whose blob is under 3/4 of the track's median area shows the object partly
    (occluded, or cut by a wall), and its centroid is displaced; motion is read without it.
    """
    if not track.present.any():
        return track.centroid
    full = track.area >= 0.75 * np.median(track.area[track.present])
    return np.where(full[:, None], track.centroid, np.nan)


def _direction_score(track: Track, expected: CaptionObject, pan: str, tr: Tracks) -> float:
    """Cosine (clipped at 0) between the measured and predicted first displacements.

    The prediction starts from the first full detection and moves at the caption's velocity
    minus the camera's, reflecting at the walls (so a clip that starts next to a wall is judged
    by its bounce, not penalised for it). The walls are placed from the shape's geometry at
    the blob's equal-area radius, which is steadier than its bounding box.
    """
    scale = min(tr.height, tr.width)
    centroid = _steady(track)
    found = np.flatnonzero(np.isfinite(centroid[:, 0]))
    shape = track.majority_shape
    if not len(found) or shape is None:
        return 0.0
    assert expected.direction is not None  # scored only for a caption that names one
    start = int(found[0])
    own = np.asarray(DIRECTIONS[expected.direction]) * SPEED[expected.motion or "slow"]
    step = (own - np.asarray(camera_velocity(pan))) * scale
    # +0.3 px: anti-aliased edge pixels below the colour threshold shrink every blob a little.
    radius = np.sqrt(np.median(track.area[track.present]) / np.pi) + 0.3
    left, right, top, bottom = extent(shape, radius)
    bounds = ((left, tr.width - right), (top, tr.height - bottom))
    c0 = centroid[start]
    n = min(_DIRECTION_FRAMES, tr.num_frames - 1 - start)
    pred = np.array(
        [[_fold(c0[a] + step[a] * k, *bounds[a]) for a in range(2)] for k in range(n + 1)]
    )
    # Cumulative displacements from the start: single steps of slow diagonal motion are
    # quantised to whole pixels, (1, 0) then (0, 1), and would read as 45 degrees off.
    want = pred[1:] - pred[0]
    got = centroid[start + 1 : start + n + 1] - c0
    cos, weight = [], []
    for g, p in zip(got, want, strict=True):
        ng, np_ = np.linalg.norm(g), np.linalg.norm(p)
        if not np.isfinite(ng) or np_ < _MOVE_PX:
            continue  # not seen whole, or predicted back at its start after a bounce
        cos.append(max(0.0, float(g @ p / (ng * np_))) if ng > 0.1 else 0.0)
        weight.append(np_)  # longer displacements have a smaller quantisation angle
    return float(np.average(cos, weights=weight)) if cos else 0.0


def _wall_events(track: Track, tr: Tracks) -> tuple[int, int]:
    """(good, bad) wall events of one track, counted per axis.

    Good: the velocity reverses while the blob is next to the wall it was moving towards.
    Bad: it reverses away from every wall, keeps moving into a wall it touches, is cut by the
    wall it was moving into, or vanishes there.
    """
    good = bad = 0
    centroid = _steady(track)
    disp = np.diff(centroid, axis=0)  # pixels; NaN unless both frames show the whole object
    size = (tr.width, tr.height)
    for a in range(2):
        v = disp[:, a]
        lo_gap = track.bbox[:, a].astype(np.float64)
        hi_gap = (size[a] - 1 - track.bbox[:, a + 2]).astype(np.float64)
        for t in range(1, len(v)):
            before, after = v[t - 1], v[t]
            if not np.isfinite(before) or abs(before) < _MOVE_PX:
                continue
            toward = hi_gap if before > 0 else lo_gap
            gap = toward[t]
            if not np.isfinite(after):
                # Not seen whole in the next frame. At the wall it was heading into, that
                # means it went through the wall: partly (cut by the edge) or entirely.
                cut = track.present[t + 1] and toward[t + 1] <= 0
                gone = not track.present[t + 1 : t + 3].any()
                bad += int(gap <= 1 and (cut or gone))
                continue
            if abs(after) < _MOVE_PX:
                continue
            if np.sign(after) != np.sign(before):
                tol = max(2.0, 0.75 * abs(before) + 1.0)  # the frame nearest the wall
                good += int(gap <= tol)
                bad += int(gap > tol)
            elif gap <= 0:
                bad += 1  # touching the wall and still moving into it
    return good, bad


def _object_motion(track: Track, expected: CaptionObject, pan: str, tr: Tracks) -> float:
    scale = min(tr.height, tr.width)
    speed = _speed(track, scale)
    if not np.isfinite(speed):
        return 0.0
    parts = []
    if expected.motion is not None:
        parts.append(_speed_score(speed, expected.motion, pan))
    if expected.motion == "still" and pan == "none":
        c = _steady(track)
        c = c[np.isfinite(c[:, 0])]
        wander = float(np.linalg.norm(c - np.median(c, axis=0), axis=-1).max()) / scale
        parts.append(float(np.clip(1.0 - (wander - _DRIFT_FREE) / _DRIFT_DECAY, 0.0, 1.0)))
    if expected.direction is not None and expected.motion != "still":
        parts.append(_direction_score(track, expected, pan, tr))
    if expected.motion != "still":
        good, bad = _wall_events(track, tr)
        if good + bad:
            parts.append(good / (good + bad))
    return float(np.mean(parts)) if parts else 1.0


def motion_fidelity(
    video, caption_or_spec: str | ClipSpec, *, tracks: Tracks | None = None
) -> float:
    """How well the objects move as the caption says (VBench motion dimensions, by hand).

    For each object the caption names (found by colour, present in >= half the frames), the
    score is the mean of the checks that apply:

    - speed: its median on-screen speed lies in the band of its class (still / slow / fast,
      widened by the pan speed when the camera pans, since screen speed is own minus camera);
    - stillness: a still object in a still camera wanders < 0.02 min(h, w) from its median
      position (score falls to 0 at 0.07);
    - direction: its displacements over the first 4 frames point where the caption's direction
      predicts, mean cosine clipped at 0 (the prediction bounces off the walls too);
    - walls: velocity reversals happen next to the wall being approached, and objects neither
      push into nor vanish through a wall (good / (good + bad) events; skipped if none).

    An object that is not found scores 0. The result is the mean over the caption's objects.

    Args:
        video: (t, h, w, 3) in [-1, 1], t >= 2.
        caption_or_spec: a caption (parsed with `vidax.data.parse_caption`) or a `ClipSpec`.

    Returns:
        Score in [0, 1]: 1 when every object moves as asked. Higher is better.
    """
    tr = _tracks(video, tracks)
    if tr.num_frames < 2:
        raise ValueError(f"motion_fidelity needs at least 2 frames, got {tr.num_frames}")
    objects, pan = _expectations(caption_or_spec)
    scores = []
    for expected in objects:
        track = tr.tracks.get(expected.colour)
        if track is None or track.presence < 0.5:
            scores.append(0.0)
            continue
        scores.append(_object_motion(track, expected, pan, tr))
    return float(np.mean(scores))


def trajectory_error(video, spec: ClipSpec, *, tracks: Tracks | None = None) -> float:
    """Distance between the detected and the ground-truth centroid paths of a spec's objects.

    Args:
        video: (t, h, w, 3) in [-1, 1], meant to show `spec` from frame 0.
        spec: the clip's ground truth (`vidax.data.trajectories` gives the paths).

    Returns:
        Mean over objects and frames of min(1, |detected - true| / min(h, w)), counting a frame
        where the object is not found as 1. In [0, 1]; 0 is perfect (rendered ground truth
        gives ~0.005 from anti-aliasing). Lower is better.
    """
    tr = _tracks(video, tracks)
    truth = trajectories(spec, tr.num_frames, tr.height, tr.width)
    scale = min(tr.height, tr.width)
    errors = []
    for obj, path in zip(spec.objects, truth, strict=True):
        track = tr.tracks.get(obj.colour)
        if track is None:
            errors.append(np.ones(tr.num_frames))
            continue
        err = np.linalg.norm(track.centroid - path, axis=-1) / scale
        errors.append(np.where(track.present, np.minimum(err, 1.0), 1.0))
    return float(np.mean(errors))


def shapes_read(
    video, caption_or_spec: str | ClipSpec, *, tracks: Tracks | None = None
) -> list[tuple[str, str | None]]:
    """(asked shape, read shape) for each of the caption's objects, in caption order.

    The read shape is the majority shape of the object's colour, or None when that colour is
    in fewer than half the frames (the object is missing). `caption_adherence` counts the
    pairs that agree.
    """
    tr = _tracks(video, tracks)
    objects, _ = _expectations(caption_or_spec)
    out = []
    for expected in objects:
        track = tr.tracks.get(expected.colour)
        found = track.majority_shape if track is not None and track.presence >= 0.5 else None
        out.append((expected.shape, found))
    return out


def caption_adherence(
    video,
    caption_or_spec: str | ClipSpec,
    *,
    check_motion: bool = False,
    tracks: Tracks | None = None,
) -> float:
    """Share of the caption's objects that are in the video (VBench object class / colour).

    An object counts when its colour is found in at least half the frames and the majority
    shape of that colour is the caption's shape. With `check_motion`, it counts by its speed
    score (see `motion_fidelity`) instead of 1 when the caption gives a motion class.

    Args:
        video: (t, h, w, 3) in [-1, 1].
        caption_or_spec: a caption or a `ClipSpec`.
        check_motion: also require the caption's speed class.

    Returns:
        Score in [0, 1]: 1 when every object is there. Higher is better.
    """
    tr = _tracks(video, tracks)
    objects, pan = _expectations(caption_or_spec)
    read = shapes_read(video, caption_or_spec, tracks=tr)
    scale = min(tr.height, tr.width)
    hits = []
    for expected, (_, shape) in zip(objects, read, strict=True):
        track = tr.tracks.get(expected.colour)
        if shape != expected.shape:
            hits.append(0.0)
            continue
        if check_motion and expected.motion is not None and tr.num_frames > 1:
            assert track is not None  # its shape was read
            speed = _speed(track, scale)
            speed = speed if np.isfinite(speed) else np.inf
            hits.append(_speed_score(speed, expected.motion, pan))
        else:
            hits.append(1.0)
    return float(np.mean(hits))
