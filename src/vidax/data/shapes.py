"""Procedural text-to-video clips of coloured shapes, with ground truth.

No pretrained video weights are reachable here, so vidax trains small models on clips whose
content is known exactly: 1-3 anti-aliased shapes (circle, square, triangle) in a fixed palette
of well-separated colours move over a dim textured background, bouncing off the frame edges,
optionally under a camera pan. Every clip is a pure function of its `ClipSpec`, and the caption
is a pure function of the spec, so `vidax.metrics` can check a generated video against the
caption that produced it.

Units. Positions are fractions of the frame (x of the width, y of the height, origin top left,
y down). Sizes and speeds are fractions of `min(height, width)` (per frame for speeds), so a clip
looks the same at any resolution. Ground-truth trajectories are returned in pixels as (x, y),
with pixel (i, j) centred at (j + 0.5, i + 0.5).

Physics. An object's velocity on screen is its own velocity minus the camera's; each axis
reflects at the frame edges (the object's extent stays inside the frame). Reflection keeps the
on-screen speed constant, which is what `vidax.metrics.motion_fidelity` checks.

    spec = sample_spec(0)
    frames, trajectories = render(spec, num_frames=33)   # (33, 64, 64, 3) in [-1, 1]
    caption(spec)  # 'a red circle bouncing fast to the left, camera panning right'
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import jax

# NumPy on the host; jax arrays where `vidax.data.scene_render` calls with `xp=jnp`.
XArray: TypeAlias = "np.ndarray | jax.Array"

# RGB in [0, 1]. Pairwise distances are >= 0.75 and every colour is >= 0.5 from the dim,
# desaturated background, so nearest-colour segmentation with a 0.3 threshold is unambiguous.
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.15, 0.15),
    "green": (0.15, 0.85, 0.2),
    "blue": (0.2, 0.35, 1.0),
    "yellow": (1.0, 0.9, 0.1),
    "white": (1.0, 1.0, 1.0),
    "magenta": (0.95, 0.2, 0.95),
}
SHAPES = ("circle", "square", "triangle")
MOTIONS = ("still", "slow", "fast")
# Screen speed in min(h, w) per frame. The classes stay separable under a pan:
# still <= PAN_SPEED < slow - PAN_SPEED and slow + PAN_SPEED < fast - PAN_SPEED.
SPEED: dict[str, float] = {"still": 0.0, "slow": 0.014, "fast": 0.04}
PAN_SPEED = 0.005
PANS = ("none", "left", "right", "up", "down")
# Unit vectors in image coordinates (x right, y down).
_D = 1 / math.sqrt(2)
DIRECTIONS: dict[str, tuple[float, float]] = {
    "right": (1.0, 0.0),
    "up-right": (_D, -_D),
    "up": (0.0, -1.0),
    "up-left": (-_D, -_D),
    "left": (-1.0, 0.0),
    "down-left": (-_D, _D),
    "down": (0.0, 1.0),
    "down-right": (_D, _D),
}
# Size is the radius of the circle of equal area (fraction of min(h, w)).
MIN_SIZE, MAX_SIZE = 0.06, 0.25
_SAMPLE_SIZE = (0.085, 0.14)

# Equal-area geometry relative to the equal-area radius r.
_SQUARE_HALF = math.sqrt(math.pi) / 2  # half side
_TRIANGLE_SIDE = math.sqrt(4 * math.pi / math.sqrt(3))
_TRIANGLE_INRADIUS = _TRIANGLE_SIDE / (2 * math.sqrt(3))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ObjectSpec:
    """One shape in a clip.

    Attributes:
        shape: one of `SHAPES`.
        colour: a key of `PALETTE`.
        size: radius of the equal-area circle, as a fraction of min(h, w).
        position: start centroid (x, y) as fractions of (width, height).
        motion: one of `MOTIONS`.
        direction: a key of `DIRECTIONS` for moving objects, None for still ones.
    """

    shape: str
    colour: str
    size: float = 0.11
    position: tuple[float, float] = (0.5, 0.5)
    motion: str = "still"
    direction: str | None = None

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} not in {SHAPES}")
        if self.colour not in PALETTE:
            raise ValueError(f"colour {self.colour!r} not in {tuple(PALETTE)}")
        if not MIN_SIZE <= self.size <= MAX_SIZE:
            raise ValueError(f"size {self.size} outside [{MIN_SIZE}, {MAX_SIZE}]")
        if len(self.position) != 2 or not all(0.0 <= p <= 1.0 for p in self.position):
            raise ValueError(f"position {self.position} must be (x, y) in [0, 1]")
        if self.motion not in MOTIONS:
            raise ValueError(f"motion {self.motion!r} not in {MOTIONS}")
        if (self.motion == "still") != (self.direction is None):
            raise ValueError("still objects take direction=None, moving ones a direction")
        if self.direction is not None and self.direction not in DIRECTIONS:
            raise ValueError(f"direction {self.direction!r} not in {tuple(DIRECTIONS)}")

    @property
    def velocity(self) -> tuple[float, float]:
        """Own velocity (x, y) in min(h, w) per frame (before the camera is subtracted)."""
        if self.direction is None:
            return (0.0, 0.0)
        dx, dy = DIRECTIONS[self.direction]
        return (SPEED[self.motion] * dx, SPEED[self.motion] * dy)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClipSpec:
    """A whole clip: 1-3 objects with distinct colours, a camera pan and a background seed.

    Colours are distinct so that an object is identified by its colour alone (the metrics
    track objects that way). Objects are drawn in order, later ones on top.
    """

    objects: tuple[ObjectSpec, ...]
    pan: str = "none"
    seed: int = 0  # background texture

    def __post_init__(self):
        if not 1 <= len(self.objects) <= 3:
            raise ValueError(f"a clip has 1-3 objects, got {len(self.objects)}")
        colours = [o.colour for o in self.objects]
        if len(set(colours)) != len(colours):
            raise ValueError(f"object colours must be distinct, got {colours}")
        if self.pan not in PANS:
            raise ValueError(f"pan {self.pan!r} not in {PANS}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def camera_velocity(self) -> tuple[float, float]:
        """Camera velocity (x, y) in min(h, w) per frame; content moves the opposite way."""
        return camera_velocity(self.pan)


def camera_velocity(pan: str) -> tuple[float, float]:
    """Camera velocity (x, y) in min(h, w) per frame for a pan in `PANS`."""
    if pan not in PANS:
        raise ValueError(f"pan {pan!r} not in {PANS}")
    step = {"none": (0, 0), "left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[pan]
    return (PAN_SPEED * step[0], PAN_SPEED * step[1])


# --------------------------------------------------------------------------- sampling


def sample_spec(
    rng: np.random.Generator | int,
    *,
    min_objects: int = 1,
    max_objects: int = 3,
    pan_probability: float = 0.3,
) -> ClipSpec:
    """Draws a random clip spec.

    Args:
        rng: a numpy Generator, or an int seed.
        min_objects, max_objects: object count range (within 1-3).
        pan_probability: chance of a camera pan (left/right/up/down equally likely).

    Returns:
        A `ClipSpec` with distinct colours, uniform shapes and motions, 8 directions, and start
        positions inside the frame that do not overlap (best effort, 20 tries).
    """
    if not 1 <= min_objects <= max_objects <= 3:
        raise ValueError(
            f"need 1 <= min_objects <= max_objects <= 3, got {min_objects}, {max_objects}"
        )
    if not 0.0 <= pan_probability <= 1.0:
        raise ValueError(f"pan_probability must be in [0, 1], got {pan_probability}")
    rng = np.random.default_rng(rng)
    n = int(rng.integers(min_objects, max_objects + 1))
    colours = rng.choice(list(PALETTE), size=n, replace=False)
    objects: list[ObjectSpec] = []
    for colour in colours:
        shape = str(rng.choice(SHAPES))
        size = float(np.round(rng.uniform(*_SAMPLE_SIZE), 4))
        motion = str(rng.choice(MOTIONS))
        direction = None if motion == "still" else str(rng.choice(list(DIRECTIONS)))
        position = (0.5, 0.5)
        margin = max(extent(shape, size)) + 0.02  # start inside the walls
        for _ in range(20):
            x, y = (float(np.round(rng.uniform(margin, 1 - margin), 4)) for _ in "xy")
            position = (x, y)
            if all(_apart(position, size, o) for o in objects):
                break
        objects.append(
            ObjectSpec(
                shape=shape,
                colour=str(colour),
                size=size,
                position=position,
                motion=motion,
                direction=direction,
            )
        )
    pan = str(rng.choice(PANS[1:])) if rng.uniform() < pan_probability else "none"
    return ClipSpec(objects=tuple(objects), pan=pan, seed=int(rng.integers(2**31)))


def _apart(position: tuple[float, float], size: float, other: ObjectSpec) -> bool:
    dist = math.hypot(position[0] - other.position[0], position[1] - other.position[1])
    return dist > 2.2 * (size + other.size)


# --------------------------------------------------------------------------- rendering


def extent(shape: str, radius: float) -> tuple[float, float, float, float]:
    """Distances from a shape's centroid to its (left, right, top, bottom) edges.

    Args:
        shape: one of `SHAPES`.
        radius: radius of the equal-area circle (any unit; the result is in the same unit).
    """
    if shape == "circle":
        return (radius, radius, radius, radius)
    if shape == "square":
        h = _SQUARE_HALF * radius
        return (h, h, h, h)
    if shape == "triangle":
        half_side = _TRIANGLE_SIDE * radius / 2
        inr = _TRIANGLE_INRADIUS * radius
        return (half_side, half_side, 2 * inr, inr)  # apex up: circumradius = 2 * inradius
    raise ValueError(f"shape {shape!r} not in {SHAPES}")


def signed_distance(
    shape: str, dx: XArray, dy: XArray, radius: float | XArray, *, xp: Any = np
) -> XArray:
    """Signed distance (negative inside) from offsets (dx, dy) to a shape at the origin.

    Args:
        shape: one of `SHAPES`, centred on its centroid (triangles apex up).
        dx, dy: broadcastable offsets from the centroid (x right, y down), in any unit.
        radius: radius of the equal-area circle, in the same unit (an array under `xp=jnp`).
        xp: the array module, `numpy` or `jax.numpy` (`vidax.data.scene_render` draws with this).

    Returns:
        The distance, broadcast over dx and dy: exact for circles and inside squares and
        triangles, slightly rounded outside their corners.
    """
    if shape == "circle":
        return xp.sqrt(dx * dx + dy * dy) - radius
    if shape == "square":
        return xp.maximum(xp.abs(dx), xp.abs(dy)) - _SQUARE_HALF * radius
    if shape == "triangle":
        # Max over the three edges' half-plane distances.
        s = math.sqrt(3) / 2
        sdf = xp.maximum(xp.maximum(dy, s * dx - 0.5 * dy), -s * dx - 0.5 * dy)
        return sdf - _TRIANGLE_INRADIUS * radius
    raise ValueError(f"shape {shape!r} not in {SHAPES}")


def _extent(obj: ObjectSpec, scale: float) -> tuple[float, float, float, float]:
    return extent(obj.shape, obj.size * scale)


def _fold(p: XArray, lo: float | XArray, hi: float | XArray, *, xp: Any = np) -> XArray:
    """Reflects an unbounded 1-d path into [lo, hi] (a triangle wave): elastic wall bounces.

    Branch-free so that `vidax.data.scene_render` folds traced bounds with `xp=jnp`; a range with
    hi <= lo pins the path to its middle.
    """
    length = hi - lo
    # A positive stand-in keeps the mod finite where the range is empty; those entries are
    # replaced by the middle below.
    safe = xp.where(length > 0, length, 1.0)
    u = xp.mod(p - lo, 2 * safe)
    return xp.where(length > 0, lo + xp.where(u <= safe, u, 2 * safe - u), (lo + hi) / 2)


def trajectories(spec: ClipSpec, num_frames: int, height: int = 64, width: int = 64) -> np.ndarray:
    """Ground-truth centroid paths of every object, without rendering.

    Returns:
        (n, t, 2) float64: centroid (x, y) in pixels of each object in `spec.objects` order.
    """
    _check_size(num_frames, height, width)
    scale = min(height, width)
    t = np.arange(num_frames, dtype=np.float64)
    cam = np.asarray(spec.camera_velocity)
    out = np.empty((len(spec.objects), num_frames, 2))
    for i, obj in enumerate(spec.objects):
        left, right, top, bottom = _extent(obj, scale)
        v = (np.asarray(obj.velocity) - cam) * scale
        x0, y0 = obj.position[0] * width, obj.position[1] * height
        out[i, :, 0] = _fold(x0 + v[0] * t, left, width - right)
        out[i, :, 1] = _fold(y0 + v[1] * t, top, height - bottom)
    return out


def _check_size(num_frames: int, height: int, width: int) -> None:
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    if min(height, width) < 16:
        raise ValueError(f"frames must be at least 16x16, got {height}x{width}")


class _TextureParams(NamedTuple):
    """A background's random parameters (numpy arrays, or per-clip arrays under `jax.vmap`)."""

    tint: XArray  # (3,) channel tint, max 1
    base: float | XArray  # gradient brightness
    angles: XArray  # (3,) wave directions, radians
    freqs: XArray  # (3,) wave frequencies, radians per min(h, w)
    phases: XArray  # (4,) three wave phases, then the gradient's
    wave_tint: XArray  # (3, 3) channel tint of each wave


def _texture_params(seed: int) -> _TextureParams:
    """The background parameters of a clip seed (also what `vidax.data.scene_render` stores)."""
    rng = np.random.default_rng([seed, 0xB6])
    tint = rng.uniform(0.55, 1.0, size=3)
    tint /= tint.max()
    base = rng.uniform(0.16, 0.24)
    angles = rng.uniform(0, 2 * np.pi, size=3)
    freqs = rng.uniform(1.5, 4.0, size=3) * 2 * np.pi  # cycles per min(h, w)
    phases = rng.uniform(0, 2 * np.pi, size=4)
    wave_tint = rng.uniform(0.5, 1.0, size=(3, 3))
    return _TextureParams(tint, base, angles, freqs, phases, wave_tint)


def _texture(
    params: _TextureParams, rows: XArray, cols: XArray, scale: int, *, xp: Any = np
) -> XArray:
    """Background colour (len(rows), len(cols), 3) in [-1, 1] at world pixel coordinates.

    A tinted vertical gradient plus three low-frequency plane waves. Channels stay in
    [0.06, 0.45] on the [0, 1] scale: dark and desaturated, far from every palette colour.
    `xp` is the array module (`jax.numpy` in `vidax.data.scene_render`).
    """
    tint, base, angles, freqs, phases, wave_tint = params
    v = ((rows + 0.5) / scale)[:, None]
    u = ((cols + 0.5) / scale)[None, :]
    bg = (base + 0.08 * xp.sin(2.0 * v + phases[3]))[..., None] * tint.reshape(1, 1, 3)
    for k in range(3):
        wave = xp.sin(freqs[k] * (xp.cos(angles[k]) * u + xp.sin(angles[k]) * v) + phases[k])
        bg = bg + (0.045 * wave)[..., None] * wave_tint[k].reshape(1, 1, 3)
    return (2.0 * xp.clip(bg, 0.06, 0.45) - 1.0).astype(np.float32)


def _pan_axis_speed(pan: str, scale: int) -> tuple[int, float]:
    """The pan's axis (0 rows, 1 columns) and the camera's speed along it, in pixels per frame."""
    cam_x, cam_y = camera_velocity(pan)
    return (1, cam_x * scale) if cam_x else (0, cam_y * scale)


def _background(spec: ClipSpec, num_frames: int, height: int, width: int) -> np.ndarray:
    """The background of every frame, (t, h, w, 3) in [-1, 1], sliding with the camera.

    The texture is evaluated once on the world strip the camera sweeps, then each frame is a
    sub-pixel (linearly interpolated) window of it: O(h w) elementwise work per frame and no
    BLAS, which matters in a loader sharing cores with a training step.
    """
    scale = min(height, width)
    axis, speed = _pan_axis_speed(spec.pan, scale)
    size = (height, width)
    params = _texture_params(spec.seed)
    if speed == 0.0:
        tex = _texture(params, np.arange(height), np.arange(width), scale)
        return np.broadcast_to(tex, (num_frames, *tex.shape)).copy()
    # World offset of frame t along the pan axis: speed * t pixels.
    shift = speed * np.arange(num_frames)
    lo = math.floor(shift.min())
    span = size[axis] + math.ceil(shift.max()) - lo + 2
    world = np.arange(span) + lo
    coords = [np.arange(height), np.arange(width)]
    coords[axis] = world
    tex = _texture(params, coords[0], coords[1], scale)
    start = np.floor(shift).astype(np.intp) - lo
    frac = (shift - np.floor(shift)).astype(np.float32)
    out = np.empty((num_frames, height, width, 3), np.float32)
    n = size[axis]
    for t in range(num_frames):
        a = tex[start[t] : start[t] + n] if axis == 0 else tex[:, start[t] : start[t] + n]
        b = (
            tex[start[t] + 1 : start[t] + 1 + n]
            if axis == 0
            else tex[:, start[t] + 1 : start[t] + 1 + n]
        )
        np.subtract(b, a, out=out[t])
        out[t] *= frac[t]
        out[t] += a
    return out


def _coverage(
    obj: ObjectSpec, cx: np.ndarray, cy: np.ndarray, height: int, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Anti-aliased coverage of one object in a per-frame window around it.

    Returns:
        alpha: (t, wy, wx) coverage in [0, 1] from a signed distance in pixels.
        rows: (t, wy) and cols: (t, wx) integer pixel indices of each frame's window.
    """
    scale = min(height, width)
    r = obj.size * scale
    # A window just larger than the shape: objects cover a few percent of the frame.
    half = max(_extent(obj, scale)) + 1.5
    wy, wx = min(height, math.ceil(2 * half)), min(width, math.ceil(2 * half))
    rows = np.clip(np.floor(cy - wy / 2), 0, height - wy).astype(np.intp)[:, None] + np.arange(wy)
    cols = np.clip(np.floor(cx - wx / 2), 0, width - wx).astype(np.intp)[:, None] + np.arange(wx)
    dx = (cols + 0.5 - cx[:, None]).astype(np.float32)[:, None, :]
    dy = (rows + 0.5 - cy[:, None]).astype(np.float32)[:, :, None]
    return np.clip(0.5 - signed_distance(obj.shape, dx, dy, r), 0.0, 1.0), rows, cols


def render(
    spec: ClipSpec, num_frames: int, height: int = 64, width: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Renders a clip.

    Args:
        spec: what to draw.
        num_frames: t, any length.
        height, width: frame size in pixels (>= 16).

    Returns:
        frames: (t, h, w, 3) float32 in [-1, 1]. Object interiors are exactly their palette
            colour; edge pixels blend with the background (one pixel of anti-aliasing).
        trajectories: (n, t, 2) float64 centroid (x, y) in pixels per object, in
            `spec.objects` order (see `trajectories`).
    """
    paths = trajectories(spec, num_frames, height, width)
    frames = _background(spec, num_frames, height, width)
    t = np.arange(num_frames)[:, None, None]
    for obj, path in zip(spec.objects, paths, strict=True):
        cx, cy = path[:, 0].astype(np.float32), path[:, 1].astype(np.float32)
        alpha, rows, cols = _coverage(obj, cx, cy, height, width)
        colour = np.asarray(PALETTE[obj.colour], np.float32) * 2 - 1
        index = (t, rows[:, :, None], cols[:, None, :])
        patch = frames[index]
        frames[index] = patch + alpha[..., None] * (colour - patch)
    return frames, paths


# --------------------------------------------------------------------------- captions

_DIRECTION_PHRASE = {
    "right": "to the right",
    "up-right": "to the upper right",
    "up": "upward",
    "up-left": "to the upper left",
    "left": "to the left",
    "down-left": "to the lower left",
    "down": "downward",
    "down-right": "to the lower right",
}
_SPEED_WORD = {"slow": "slowly", "fast": "fast"}


def describe(obj: ObjectSpec) -> str:
    """'a red circle bouncing fast to the left' / 'a blue square standing still'."""
    article = "an" if obj.colour[0] in "aeiou" else "a"
    head = f"{article} {obj.colour} {obj.shape}"
    if obj.motion == "still":
        return f"{head} standing still"
    # Every moving object bounces off the frame edges, hence one verb for both speeds.
    assert obj.direction is not None  # ObjectSpec: a moving object has a direction
    return f"{head} bouncing {_SPEED_WORD[obj.motion]} {_DIRECTION_PHRASE[obj.direction]}"


def caption(spec: ClipSpec) -> str:
    """The clip's caption: one clause per object, then the pan, joined by ', '.

    e.g. 'a red circle bouncing fast to the left, a blue square standing still, camera
    panning right'. `parse_caption` inverts it.
    """
    clauses = [describe(o) for o in spec.objects]
    if spec.pan != "none":
        clauses.append(f"camera panning {spec.pan}")
    return ", ".join(clauses)


class CaptionObject(NamedTuple):
    """An object a caption asks for; motion/direction are None when the caption is silent."""

    colour: str
    shape: str
    motion: str | None
    direction: str | None


_OBJECT_RE = re.compile(
    r"\b(?:a|an|one)\s+(?P<colour>{})\s+(?P<shape>{})s?\b(?P<rest>.*)".format(
        "|".join(PALETTE), "|".join(SHAPES)
    )
)
_PAN_RE = re.compile(r"\bcamera\s+(?:is\s+)?pan(?:s|ning)?\s+(?P<pan>left|right|up|down)\b")
_STILL_RE = re.compile(r"\b(?:still|static|stationary|motionless|not moving)\b")
_SLOW_RE = re.compile(r"\b(?:slow|slowly)\b")
_FAST_RE = re.compile(r"\b(?:fast|quickly|rapidly|quick)\b")
_MOVING_RE = re.compile(r"\b(?:moving|bouncing|drifting|sliding)\b")
# Longest phrases first so 'upper left' is not read as 'left'.
_DIRECTION_RES = [
    (name, re.compile(pattern))
    for name, pattern in (
        ("up-right", r"\b(?:upper|top|up)[ -]right\b"),
        ("up-left", r"\b(?:upper|top|up)[ -]left\b"),
        ("down-right", r"\b(?:lower|bottom|down)[ -]right\b"),
        ("down-left", r"\b(?:lower|bottom|down)[ -]left\b"),
        ("right", r"\bright(?:ward)?\b"),
        ("left", r"\bleft(?:ward)?\b"),
        ("up", r"\bup(?:ward|wards)?\b"),
        ("down", r"\bdown(?:ward|wards)?\b"),
    )
]


def parse_caption(text: str) -> list[CaptionObject]:
    """The objects a caption asks for, in order (inverse of `caption`).

    Clauses are separated by commas, semicolons or 'and'. A clause must name an object
    ('a <colour> <shape> ...') or the camera ('camera panning <dir>').

    Raises:
        ValueError: for an empty caption, or a clause that names neither a known object nor the
            camera (e.g. an unknown colour).
    """
    objects: list[CaptionObject] = []
    for clause in _clauses(text):
        if _PAN_RE.search(clause):
            continue
        m = _OBJECT_RE.search(clause)
        if m is None:
            raise ValueError(f"caption clause {clause!r} names no known object or camera pan")
        rest = m["rest"]
        motion: str | None
        direction: str | None
        if _STILL_RE.search(rest):
            motion, direction = "still", None
        else:
            motion = "fast" if _FAST_RE.search(rest) else "slow" if _SLOW_RE.search(rest) else None
            direction = next((n for n, r in _DIRECTION_RES if r.search(rest)), None)
        objects.append(CaptionObject(m["colour"], m["shape"], motion, direction))
    if not objects:
        raise ValueError(f"caption {text!r} names no object")
    return objects


def canonical_caption(text: str) -> str:
    """`text` in the caption grammar the shapes models were trained on, where it can be read
    without guessing; else `text` unchanged.

    'a red square moving right' -> 'a red square bouncing slowly to the right' (a direction
    without a speed is the slow speed), 'a blue circle, camera pans left' -> ... Clauses that
    name an object without saying where it goes ('a red circle bouncing') stay as written;
    a clause naming no known object or pan leaves the whole prompt as written. Captions of
    `caption` are fixed points.
    """
    clauses: list[str] = []
    pans: list[str] = []
    for clause in _clauses(text):
        if m := _PAN_RE.search(clause):
            pans.append(f"camera panning {m['pan']}")
            continue
        if _OBJECT_RE.search(clause) is None:
            return text
        (obj,) = parse_caption(clause)
        if obj.motion == "still":
            clauses.append(describe(ObjectSpec(shape=obj.shape, colour=obj.colour)))
        elif obj.direction is not None:
            moving = ObjectSpec(
                shape=obj.shape,
                colour=obj.colour,
                motion=obj.motion or "slow",
                direction=obj.direction,
            )
            clauses.append(describe(moving))
        else:
            clauses.append(clause)
    if not clauses:
        return text
    return ", ".join(clauses + pans[:1])


def parse_pan(text: str) -> str:
    """The camera pan a caption asks for: one of `PANS` ('none' when it names none)."""
    m = _PAN_RE.search(text.lower())
    return m["pan"] if m else "none"


def _clauses(text: str) -> list[str]:
    return [c.strip() for c in re.split(r",|;|\band\b", text.lower()) if c.strip()]


# --------------------------------------------------------------------------- evaluation prompts


class EvalPrompt(NamedTuple):
    """An evaluation prompt: a category, its ground-truth spec and a sampling seed."""

    name: str
    category: str
    spec: ClipSpec
    seed: int

    @property
    def caption(self) -> str:
        return caption(self.spec)


def _o(shape, colour, motion="still", direction=None, x=0.5, y=0.5, size=0.11) -> ObjectSpec:
    return ObjectSpec(
        shape=shape, colour=colour, size=size, position=(x, y), motion=motion, direction=direction
    )


# Hand-written so that they never change with a sampler. "bouncing" prompts start an object
# next to a wall, moving into it, so that it reverses within the first 17 frames. Objects of one
# clip keep to separate lanes and never overlap within 33 frames (occlusion would blur what
# the metrics measure).
_EVAL_TABLE: dict[str, list[tuple[tuple[ObjectSpec, ...], str]]] = {
    "static": [
        ((_o("circle", "red"),), "none"),
        ((_o("square", "blue", x=0.4, y=0.6, size=0.13),), "none"),
        ((_o("triangle", "yellow", y=0.55, size=0.13),), "none"),
        ((_o("circle", "white", x=0.3, y=0.3), _o("square", "green", x=0.7, y=0.7)), "none"),
        ((_o("triangle", "magenta", x=0.65, y=0.4, size=0.12),), "none"),
        ((_o("square", "red", x=0.3), _o("triangle", "blue", x=0.72, size=0.12)), "none"),
    ],
    "slow": [
        ((_o("circle", "green", "slow", "right", x=0.3),), "none"),
        ((_o("square", "magenta", "slow", "down", y=0.3),), "none"),
        ((_o("triangle", "red", "slow", "left", x=0.7, size=0.12),), "none"),
        ((_o("circle", "blue", "slow", "up-right", x=0.35, y=0.65),), "none"),
        ((_o("square", "yellow", "slow", "up", y=0.7),), "none"),
        ((_o("triangle", "white", "slow", "down-left", x=0.65, y=0.35, size=0.12),), "none"),
    ],
    "fast": [
        ((_o("circle", "yellow", "fast", "right", x=0.25),), "none"),
        ((_o("square", "red", "fast", "down-right", x=0.3, y=0.3),), "none"),
        ((_o("triangle", "green", "fast", "left", x=0.75, size=0.12),), "none"),
        ((_o("circle", "magenta", "fast", "up", y=0.75),), "none"),
        ((_o("square", "white", "fast", "up-left", x=0.7, y=0.7),), "none"),
        ((_o("triangle", "blue", "fast", "down", y=0.3, size=0.12),), "none"),
    ],
    "bouncing": [
        ((_o("circle", "red", "fast", "right", x=0.72),), "none"),
        ((_o("square", "green", "fast", "left", x=0.28),), "none"),
        ((_o("triangle", "yellow", "fast", "down", y=0.7, size=0.12),), "none"),
        ((_o("circle", "blue", "fast", "up", y=0.3),), "none"),
        ((_o("square", "magenta", "fast", "down-right", x=0.7, y=0.7),), "none"),
    ],
    "multi": [
        (
            (_o("circle", "red", "fast", "right", x=0.3, y=0.25), _o("square", "blue", y=0.7)),
            "none",
        ),
        (
            (
                _o("triangle", "green", "slow", "right", x=0.55, y=0.25, size=0.12),
                _o("circle", "yellow", "fast", "down", x=0.22, y=0.4),
            ),
            "none",
        ),
        (
            (
                _o("square", "white", x=0.25, y=0.25, size=0.1),
                _o("circle", "magenta", "slow", "left", x=0.55, y=0.75, size=0.1),
                _o("triangle", "red", "fast", "up", x=0.84, y=0.45, size=0.1),
            ),
            "none",
        ),
        (
            (
                _o("circle", "blue", "slow", "up", x=0.2, y=0.55, size=0.1),
                _o("square", "yellow", "fast", "left", x=0.6, y=0.8, size=0.1),
                _o("triangle", "magenta", x=0.8, y=0.2, size=0.1),
            ),
            "none",
        ),
        (
            (
                _o("triangle", "white", "fast", "right", x=0.3, y=0.75, size=0.12),
                _o("square", "red", "slow", "up-left", x=0.7, y=0.35),
            ),
            "none",
        ),
        (
            (_o("circle", "green", x=0.5, y=0.3), _o("circle", "red", "slow", "right", y=0.72)),
            "none",
        ),
    ],
    "pan": [
        ((_o("circle", "red"),), "left"),
        ((_o("square", "yellow", x=0.4),), "right"),
        ((_o("triangle", "blue", "slow", "up", y=0.65, size=0.12),), "left"),
        ((_o("circle", "white", "fast", "right", x=0.3),), "down"),
        ((_o("square", "green", x=0.3, y=0.35), _o("circle", "magenta", x=0.7, y=0.65)), "right"),
        (
            (
                _o("triangle", "red", "slow", "right", x=0.3, y=0.25, size=0.12),
                _o("square", "blue", "fast", "left", x=0.65, y=0.75),
            ),
            "up",
        ),
    ],
}


def _eval_prompts() -> tuple[EvalPrompt, ...]:
    out: list[EvalPrompt] = []
    for category, rows in _EVAL_TABLE.items():
        for i, (objects, pan) in enumerate(rows):
            seed = 1000 + len(out)
            spec = ClipSpec(objects=objects, pan=pan, seed=seed)
            out.append(EvalPrompt(f"{category}-{i}", category, spec, seed))
    return tuple(out)


EVAL_PROMPTS: tuple[EvalPrompt, ...] = _eval_prompts()


# Third entropy word of the random evaluation stream. The training clips are
# rng([seed, index]) (`vidax.data.clip_at`), which numpy seeds like rng([seed, index, 0]), so a
# nonzero word keeps every random evaluation spec out of every training stream; a plain
# rng(seed + i) would reproduce training clip (seed + i, 0).
_RANDOM_STREAM = 0xE7A1


def categorise(spec: ClipSpec) -> str:
    """The evaluation category of a spec: "multi" (2-3 objects), else "pan" (one object under a
    camera pan), else the object's motion: "static", "slow" or "fast".

    The classes split the specs by what makes them hard (several objects, a moving camera,
    speed) and reuse the fixed set's names; unlike the fixed set, they do not sort multi-object
    clips by motion or pan, nor single out wall bounces.
    """
    if len(spec.objects) > 1:
        return "multi"
    if spec.pan != "none":
        return "pan"
    motion = spec.objects[0].motion
    return "static" if motion == "still" else motion


def random_eval_prompts(n: int, seed: int = 0) -> tuple[EvalPrompt, ...]:
    """`n` fresh draws from the training distribution, as evaluation prompts.

    Prompt i has spec `sample_spec(np.random.default_rng([seed, i, 0xE7A1]))` (the training
    loader's defaults, a stream no training clip shares), category `categorise(spec)`, name
    f"random-{seed}-{i}" and sampling seed `seed + i`. The same (n, seed) gives the same
    prompts, and a larger n extends a smaller one.

    Args:
        n: number of prompts (>= 1).
        seed: first seed of the range (>= 0).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    out = []
    for i in range(n):
        spec = sample_spec(np.random.default_rng([seed, i, _RANDOM_STREAM]))
        out.append(EvalPrompt(f"random-{seed}-{i}", categorise(spec), spec, seed + i))
    return tuple(out)
