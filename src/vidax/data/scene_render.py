"""Shapes clips sampled, drawn and captioned on device: a jit/vmap-able JAX twin of `shapes`.

`shapes.render` draws one `ClipSpec` with numpy on the host. Here a batch of clip specs is a
`Scenes` pytree of arrays, so a train step can sample (`sample_scenes`), draw (`render`) and
caption (`caption_ids`, `caption_embeddings`) fresh clips itself, with no host loader. The numpy
renderer stays the reference: the same trajectories, background texture, signed distances and
one-pixel anti-aliasing, through code that `shapes` shares with this module (`xp=jnp`), so
`render(scenes_from_specs(specs), t)` equals `shapes.render` up to float32 rounding: within 5e-5
on object edges for clips of up to 33 frames (float32 trajectories; the gap grows with t, 1.2e-4
at 300 frames), 3e-6 elsewhere (tests/data/test_render.py).

    scenes = sample_scenes(jax.random.key(0), 64)       # 64 clip specs, on device
    video = render(scenes, num_frames=33)                # (64, 33, 64, 64, 3) in [-1, 1]
    text, mask = caption_embeddings(scenes, HashedTextEmbedder(dim=256, text_len=32))
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vidax.data import shapes
from vidax.data.shapes import (
    DIRECTIONS,
    MOTIONS,
    PALETTE,
    PANS,
    SHAPES,
    SPEED,
    ClipSpec,
    ObjectSpec,
    XArray,
    camera_velocity,
    caption,
    describe,
    extent,
    signed_distance,
)
from vidax.text.hashed import HashedTextEmbedder

MAX_OBJECTS = 3  # object slots per scene (`ClipSpec` allows 1-3 objects)
SHAPE_INDEX: dict[str, int] = {name: i for i, name in enumerate(SHAPES)}
COLOUR_INDEX: dict[str, int] = {name: i for i, name in enumerate(PALETTE)}
MOTION_INDEX: dict[str, int] = {name: i for i, name in enumerate(MOTIONS)}
DIRECTION_INDEX: dict[str, int] = {name: i for i, name in enumerate(DIRECTIONS)}
PAN_INDEX: dict[str, int] = {name: i for i, name in enumerate(PANS)}

# Lookup tables indexed by the Scenes' int fields. Colours are converted as shapes.render does
# (float32, then to [-1, 1]), so object interiors are bit-identical.
_COLOURS = np.asarray(list(PALETTE.values()), np.float32) * 2 - 1  # (6, 3)
_SPEEDS = np.asarray([SPEED[m] for m in MOTIONS], np.float32)  # (3,)
_DIRECTIONS = np.asarray(list(DIRECTIONS.values()), np.float32)  # (8, 2)
_CAMERA = np.asarray([camera_velocity(p) for p in PANS], np.float32)  # (5, 2)
_EXTENTS = np.asarray([extent(s, 1.0) for s in SHAPES], np.float32)  # (3, 4) per unit radius


class Scenes(NamedTuple):
    """A batch of n clip specs as arrays (a pytree; NumPy on the host, jax arrays on device):
    `MAX_OBJECTS` slots per clip.

    Objects fill slots in draw order (later on top); absent slots draw and say nothing, and
    their other fields are ignored. Texture fields are `shapes._texture_params` as drawn.

    Attributes:
        present: (n, 3) bool, slot used.
        shape: (n, 3) int32 index into `SHAPES`.
        colour: (n, 3) int32 index into `PALETTE` (distinct among present slots).
        size: (n, 3) float32 equal-area radius, fraction of min(h, w).
        position: (n, 3, 2) float32 start centroid (x, y), fractions of (width, height).
        motion: (n, 3) int32 index into `MOTIONS`.
        direction: (n, 3) int32 index into `DIRECTIONS` (0 for still objects).
        pan: (n,) int32 index into `PANS`.
        tint: (n, 3) float32 background channel tint (max 1).
        base: (n,) float32 background gradient brightness.
        angles: (n, 3) float32 wave directions, radians.
        freqs: (n, 3) float32 wave frequencies, radians per min(h, w).
        phases: (n, 4) float32 three wave phases, then the gradient's.
        wave_tint: (n, 3, 3) float32 channel tint of each wave.
    """

    present: XArray
    shape: XArray
    colour: XArray
    size: XArray
    position: XArray
    motion: XArray
    direction: XArray
    pan: XArray
    tint: XArray
    base: XArray
    angles: XArray
    freqs: XArray
    phases: XArray
    wave_tint: XArray


def _check_scenes(scenes: Scenes) -> int:
    """The batch size n, after checking every field's shape against it."""
    n = jnp.shape(scenes.pan)[0] if jnp.ndim(scenes.pan) == 1 else -1
    k = MAX_OBJECTS
    want = {
        "present": (n, k),
        "shape": (n, k),
        "colour": (n, k),
        "size": (n, k),
        "position": (n, k, 2),
        "motion": (n, k),
        "direction": (n, k),
        "pan": (n,),
        "tint": (n, 3),
        "base": (n,),
        "angles": (n, 3),
        "freqs": (n, 3),
        "phases": (n, 4),
        "wave_tint": (n, 3, 3),
    }
    for name, shape in want.items():
        got = tuple(jnp.shape(getattr(scenes, name)))
        if got != shape:
            raise ValueError(f"Scenes.{name} has shape {got}, expected {shape} (n from Scenes.pan)")
    return n


# --------------------------------------------------------------------------- specs <-> arrays


def scenes_from_specs(specs: Sequence[ClipSpec]) -> Scenes:
    """Host-side numpy `Scenes` of clip specs; `render` of it matches `shapes.render`.

    The texture parameters are drawn from each spec's seed by `shapes._texture_params`, the
    draw `shapes.render` itself makes.
    """
    if not specs:
        raise ValueError("scenes_from_specs needs at least one ClipSpec")
    n, k = len(specs), MAX_OBJECTS
    present = np.zeros((n, k), bool)
    shape, colour, motion, direction = (np.zeros((n, k), np.int32) for _ in range(4))
    size = np.zeros((n, k), np.float32)
    position = np.full((n, k, 2), 0.5, np.float32)
    pan = np.zeros(n, np.int32)
    textures = []
    for i, spec in enumerate(specs):
        for j, obj in enumerate(spec.objects):
            present[i, j] = True
            shape[i, j] = SHAPE_INDEX[obj.shape]
            colour[i, j] = COLOUR_INDEX[obj.colour]
            size[i, j] = obj.size
            position[i, j] = obj.position
            motion[i, j] = MOTION_INDEX[obj.motion]
            direction[i, j] = 0 if obj.direction is None else DIRECTION_INDEX[obj.direction]
        pan[i] = PAN_INDEX[spec.pan]
        textures.append(shapes._texture_params(spec.seed))
    tex = [np.asarray(field, np.float32) for field in zip(*textures, strict=True)]
    return Scenes(present, shape, colour, size, position, motion, direction, pan, *tex)


def specs_from_scenes(scenes: Scenes) -> list[ClipSpec]:
    """The `ClipSpec`s of a `Scenes` batch (host-side), e.g. to score sampled scenes.

    Objects, pan and so the caption carry over exactly. The background does not: it lives in the
    arrays, not in a seed, so every spec gets seed=0 and `shapes.render` of it draws seed 0's
    texture behind the same objects.
    """
    n = _check_scenes(scenes)
    a = Scenes(*(np.asarray(field) for field in scenes))
    specs = []
    for i in range(n):
        objects = []
        for j in np.flatnonzero(a.present[i]):
            motion = MOTIONS[a.motion[i, j]]
            objects.append(
                ObjectSpec(
                    shape=SHAPES[a.shape[i, j]],
                    colour=list(PALETTE)[a.colour[i, j]],
                    size=float(a.size[i, j]),
                    position=(float(a.position[i, j, 0]), float(a.position[i, j, 1])),
                    motion=motion,
                    direction=None if motion == "still" else list(DIRECTIONS)[a.direction[i, j]],
                )
            )
        specs.append(ClipSpec(objects=tuple(objects), pan=PANS[a.pan[i]], seed=0))
    return specs


# --------------------------------------------------------------------------- sampling


@functools.partial(jax.jit, static_argnames=("n", "min_objects", "max_objects", "pan_probability"))
def sample_scenes(
    key: jax.Array,
    n: int,
    *,
    min_objects: int = 1,
    max_objects: int = 3,
    pan_probability: float = 0.3,
) -> Scenes:
    """Draws n clip specs on device, distributed as `shapes.sample_spec` draws them.

    Object count uniform in [min_objects, max_objects]; distinct colours; uniform shapes,
    motions and 8 directions; sizes uniform in `shapes._SAMPLE_SIZE` (not rounded to 4 decimals
    as sample_spec does); start positions uniform inside the walls plus 0.02, and apart from
    earlier objects (`shapes._apart`) when one of 20 candidates is, else the last candidate; a
    left/right/up/down pan with probability `pan_probability`; textures from `_texture_params`'
    ranges.

    Args:
        key: a PRNG key.
        n: clips to draw (static).
        min_objects, max_objects: object count range (within 1-3, static).
        pan_probability: chance of a camera pan (static).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= min_objects <= max_objects <= MAX_OBJECTS:
        raise ValueError(
            f"need 1 <= min_objects <= max_objects <= 3, got {min_objects}, {max_objects}"
        )
    if not 0.0 <= pan_probability <= 1.0:
        raise ValueError(f"pan_probability must be in [0, 1], got {pan_probability}")
    k, tries = MAX_OBJECTS, 20
    # One uniform draw, sliced into every variate: each separate jax.random call adds a
    # threefry kernel, about 0.4 s of CPU compile time apiece.
    widths = {
        "count": 1,
        "colour": len(PALETTE),
        "shape": k,
        "size": k,
        "motion": k,
        "direction": k,
        "position": k * tries * 2,
        "pan": 1,
        "pan_direction": 1,
        "tint": 3,
        "base": 1,
        "angles": 3,
        "freqs": 3,
        "phases": 4,
        "wave_tint": 9,
    }
    draws = jax.random.uniform(key, (n, sum(widths.values())))
    cuts = np.cumsum(list(widths.values()))[:-1]
    u = dict(zip(widths, jnp.split(draws, cuts, axis=1), strict=True))

    def uniform(name: str, lo: float, hi: float) -> jax.Array:
        return lo + (hi - lo) * u[name]

    def integers(name: str, lo: int, hi: int) -> jax.Array:  # uniform in [lo, hi)
        return jnp.minimum(lo + jnp.floor((hi - lo) * u[name]).astype(jnp.int32), hi - 1)

    count = integers("count", min_objects, max_objects + 1)  # (n, 1)
    present = jnp.arange(k)[None] < count
    # The first k of a random permutation: distinct colours, each subset and order equally likely.
    colour = jnp.argsort(u["colour"], axis=-1)[:, :k]
    shape = integers("shape", 0, len(SHAPES))
    size = uniform("size", *shapes._SAMPLE_SIZE)
    motion = integers("motion", 0, len(MOTIONS))
    direction = integers("direction", 0, len(DIRECTIONS))
    direction = jnp.where(motion == MOTION_INDEX["still"], 0, direction)

    margin = jnp.max(jnp.asarray(_EXTENTS)[shape], axis=-1) * size + 0.02  # (n, k)
    margin = margin[..., None, None]
    candidates = margin + (1 - 2 * margin) * u["position"].reshape(n, k, tries, 2)
    # Sequential over slots as in sample_spec: each object keeps clear of those already placed.
    # Earlier slots of a present slot are present, so no mask is needed.
    placed = [candidates[:, 0, 0]]  # the first object takes its first candidate
    for j in range(1, k):
        clear = [
            jnp.sqrt(jnp.sum((candidates[:, j] - other[:, None]) ** 2, axis=-1))
            > 2.2 * (size[:, j] + size[:, i])[:, None]
            for i, other in enumerate(placed)
        ]
        apart = functools.reduce(jnp.logical_and, clear)  # (n, tries)
        pick = jnp.where(apart.any(-1), jnp.argmax(apart, axis=-1), tries - 1)
        placed.append(jnp.take_along_axis(candidates[:, j], pick[:, None, None], axis=1)[:, 0])
    position = jnp.stack(placed, axis=1)

    panned = u["pan"][:, 0] < pan_probability
    pan = jnp.where(panned, integers("pan_direction", 1, len(PANS))[:, 0], 0)  # 0: "none"

    tint = uniform("tint", 0.55, 1.0)
    tint = tint / jnp.max(tint, axis=-1, keepdims=True)
    base = uniform("base", 0.16, 0.24)[:, 0]
    angles = uniform("angles", 0.0, 2 * math.pi)
    freqs = uniform("freqs", 1.5, 4.0) * (2 * math.pi)
    phases = uniform("phases", 0.0, 2 * math.pi)
    wave_tint = uniform("wave_tint", 0.5, 1.0).reshape(n, 3, 3)
    colour = colour.astype(jnp.int32)
    texture = (tint, base, angles, freqs, phases, wave_tint)
    return Scenes(present, shape, colour, size, position, motion, direction, pan, *texture)


# --------------------------------------------------------------------------- rendering


@functools.partial(jax.jit, static_argnames=("num_frames", "height", "width"))
def trajectories(scenes: Scenes, num_frames: int, height: int = 64, width: int = 64) -> jax.Array:
    """Ground-truth centroid paths, as `shapes.trajectories` (float32 instead of float64).

    Returns:
        (n, 3, t, 2) float32 centroid (x, y) in pixels per slot; meaningless for absent slots.
    """
    shapes._check_size(num_frames, height, width)
    _check_scenes(scenes)
    scale = min(height, width)
    own = (
        jnp.asarray(_SPEEDS)[scenes.motion][..., None] * jnp.asarray(_DIRECTIONS)[scenes.direction]
    )
    v = (own - jnp.asarray(_CAMERA)[scenes.pan][:, None]) * scale  # (n, 3, 2) px per frame
    # (left, right, top, bottom) distances from the centroid to the edges, in pixels.
    ext = jnp.asarray(_EXTENTS)[scenes.shape] * (scenes.size * scale)[..., None]
    frame = jnp.asarray([width, height], jnp.float32).reshape(1, 1, 2)
    lo = ext[..., 0::2]  # (left, top)
    hi = frame - ext[..., 1::2]  # (width - right, height - bottom)
    t = jnp.arange(num_frames, dtype=jnp.float32).reshape(1, 1, -1, 1)
    p = (scenes.position * frame)[..., None, :] + v[..., None, :] * t  # (n, 3, t, 2)
    return jnp.asarray(shapes._fold(p, lo[..., None, :], hi[..., None, :], xp=jnp))


def _pan_tables(num_frames: int, scale: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each pan's axis (5,), and each frame's floor (5, t) and fraction (5, t) of its shift.

    Computed on the host in float64 as `shapes._background` does, so the integer texture
    coordinates and lerp weights are identical to the reference's.
    """
    axes, floors, fracs = [], [], []
    for pan in PANS:
        axis, speed = shapes._pan_axis_speed(pan, scale)
        shift = speed * np.arange(num_frames)
        axes.append(axis)
        floors.append(np.floor(shift))
        fracs.append((shift - np.floor(shift)).astype(np.float32))
    return np.asarray(axes, np.int32), np.asarray(floors).astype(np.int32), np.stack(fracs)


def _background(scenes: Scenes, num_frames: int, height: int, width: int) -> jax.Array:
    """Each clip's background, (n, t, h, w, 3) in [-1, 1], sliding with the camera.

    As in `shapes._background`, frame pixel i along the pan axis lerps the texture at world
    pixels floor(shift) + i and floor(shift) + i + 1 by frac(shift). The texture is evaluated
    once per clip on the grid of world pixels that the frames sample, then gathered.
    """
    scale = min(height, width)
    axes, floors, fracs = _pan_tables(num_frames, scale)
    lows = floors.min(axis=1)
    # Grid margins along rows and columns: the widest sweep of any pan on that axis, plus the
    # lerp's right-hand neighbour.
    reach = floors.max(axis=1) - lows + 1
    extra = [int(reach[axes == a].max(initial=1)) for a in (0, 1)]
    pan_axes, pan_floors, pan_fracs, pan_lows = (
        jnp.asarray(x) for x in (axes, floors, fracs, lows)
    )

    def one(params: shapes._TextureParams, pan: XArray) -> jax.Array:
        along = [pan_axes[pan] == a for a in (0, 1)]  # the pan moves along rows / columns
        low = [jnp.where(along[a], pan_lows[pan], 0) for a in (0, 1)]
        rows = (low[0] + jnp.arange(height + extra[0])).astype(jnp.float32)
        cols = (low[1] + jnp.arange(width + extra[1])).astype(jnp.float32)
        tex = shapes._texture(params, rows, cols, scale, xp=jnp)  # (h + e0, w + e1, 3)
        offset = pan_floors[pan] - pan_lows[pan]  # (t,) >= 0
        r = jnp.where(along[0], offset, 0)[:, None, None] + jnp.arange(height)[None, :, None]
        c = jnp.where(along[1], offset, 0)[:, None, None] + jnp.arange(width)[None, None, :]
        a = tex[r, c]  # (t, h, w, 3)
        b = tex[r + along[0].astype(jnp.int32), c + along[1].astype(jnp.int32)]
        # The reference's operation order: (b - a) * frac + a. No pan: frac = 0, exactly a.
        return (b - a) * pan_fracs[pan][:, None, None, None] + a

    params = shapes._TextureParams(
        scenes.tint, scenes.base, scenes.angles, scenes.freqs, scenes.phases, scenes.wave_tint
    )
    return jax.vmap(one)(params, scenes.pan)


@functools.partial(jax.jit, static_argnames=("num_frames", "height", "width"))
def render(scenes: Scenes, num_frames: int, height: int = 64, width: int = 64) -> jax.Array:
    """Renders a batch of clips, as `shapes.render` renders each (see `scenes_from_specs`).

    Coverage is clip(0.5 - signed distance in pixels, 0, 1) over the whole frame (the
    reference's per-object window only saves host work), composited in slot order.

    Args:
        scenes: n clip specs.
        num_frames, height, width: clip size t, h, w (static; h, w >= 16).

    Returns:
        (n, t, h, w, 3) float32 in [-1, 1].
    """
    shapes._check_size(num_frames, height, width)
    _check_scenes(scenes)
    scale = min(height, width)
    paths = trajectories(scenes, num_frames, height, width)  # (n, 3, t, 2)
    frames = _background(scenes, num_frames, height, width)
    cols = jnp.arange(width, dtype=jnp.float32).reshape(1, 1, 1, -1) + 0.5  # pixel centres
    rows = jnp.arange(height, dtype=jnp.float32).reshape(1, 1, -1, 1) + 0.5
    colours = jnp.asarray(_COLOURS)[scenes.colour]  # (n, 3, 3)
    for j in range(MAX_OBJECTS):
        dx = cols - paths[:, j, :, 0, None, None]  # (n, t, 1, w)
        dy = rows - paths[:, j, :, 1, None, None]  # (n, t, h, 1)
        radius = (scenes.size[:, j] * scale)[:, None, None, None]
        kind = scenes.shape[:, j, None, None, None]
        distance = jnp.select(
            [kind == i for i in range(len(SHAPES))],
            [signed_distance(s, dx, dy, radius, xp=jnp) for s in SHAPES],
        )
        distance = jnp.where(scenes.present[:, j, None, None, None], distance, jnp.inf)
        alpha = jnp.clip(0.5 - distance, 0.0, 1.0)[..., None]  # absent: exactly 0
        frames = frames + alpha * (colours[:, j, None, None, None] - frames)
    return frames


# --------------------------------------------------------------------------- captions


def _caption_grammar() -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every clause `shapes.caption` can write, as word lists, from `describe`/`caption`.

    Returns:
        vocab: sorted words; clause ids (6, 3, 3, 8, L) and lengths (6, 3, 3, 8) by (colour,
        shape, motion, direction); pan clause ids (5, L) and lengths (5,) (0 for 'none').
    """
    words = HashedTextEmbedder.words
    clauses: dict[tuple[int, int, int, int], list[str]] = {}
    for (c, colour), (s, shape), (m, motion), (d, direction) in itertools.product(
        enumerate(PALETTE), enumerate(SHAPES), enumerate(MOTIONS), enumerate(DIRECTIONS)
    ):
        moving = None if motion == "still" else direction
        obj = ObjectSpec(shape=shape, colour=colour, motion=motion, direction=moving)
        clauses[c, s, m, d] = words(describe(obj))
    probe = ObjectSpec(shape=SHAPES[0], colour=next(iter(PALETTE)))
    # The pan clause is what a caption adds after its one object's words.
    skip = len(words(describe(probe)))
    pans = [words(caption(ClipSpec(objects=(probe,), pan=p)))[skip:] for p in PANS]
    vocab = tuple(sorted({w for ws in [*clauses.values(), *pans] for w in ws}))
    index = {w: i for i, w in enumerate(vocab)}
    longest = max(len(ws) for ws in [*clauses.values(), *pans])
    grid = (len(PALETTE), len(SHAPES), len(MOTIONS), len(DIRECTIONS))
    clause_ids = np.zeros((*grid, longest), np.int32)
    clause_len = np.zeros(grid, np.int32)
    for key, ws in clauses.items():
        clause_ids[key][: len(ws)] = [index[w] for w in ws]
        clause_len[key] = len(ws)
    pan_ids = np.zeros((len(PANS), longest), np.int32)
    pan_len = np.asarray([len(ws) for ws in pans], np.int32)
    for p, ws in enumerate(pans):
        pan_ids[p, : len(ws)] = [index[w] for w in ws]
    return vocab, clause_ids, clause_len, pan_ids, pan_len


CAPTION_VOCAB, _CLAUSE_IDS, _CLAUSE_LEN, _PAN_IDS, _PAN_LEN = _caption_grammar()


@functools.partial(jax.jit, static_argnames=("text_len",))
def caption_ids(scenes: Scenes, text_len: int) -> tuple[jax.Array, jax.Array]:
    """The words of each clip's `shapes.caption` as indices into `CAPTION_VOCAB`.

    Words are `HashedTextEmbedder.words` (lower-case [a-z0-9]+ runs), truncated to text_len.

    Returns:
        ids: (n, text_len) int32 (0 past the caption's end) and mask: (n, text_len) bool, True
        on real words.
    """
    if text_len < 1:
        raise ValueError(f"text_len must be >= 1, got {text_len}")
    n = _check_scenes(scenes)
    key = (scenes.colour, scenes.shape, scenes.motion, scenes.direction)
    clause_len = jnp.where(scenes.present, jnp.asarray(_CLAUSE_LEN)[key], 0)  # (n, 3)
    # Four segments per caption: the three object clauses, then the pan clause.
    pan_ids, pan_len = jnp.asarray(_PAN_IDS)[scenes.pan], jnp.asarray(_PAN_LEN)[scenes.pan]
    segments = jnp.concatenate([jnp.asarray(_CLAUSE_IDS)[key], pan_ids[:, None]], 1)  # (n, 4, L)
    lengths = jnp.concatenate([clause_len, pan_len[:, None]], 1)  # (n, 4)
    ends = jnp.cumsum(lengths, axis=1)  # (n, 4)
    pos = jnp.arange(text_len)
    # Word pos lies in the first segment that ends after it (empty segments are skipped).
    which = jnp.minimum(jnp.sum(ends[:, None, :] <= pos[None, :, None], axis=-1), 3)  # (n, len)
    start = jnp.take_along_axis(ends - lengths, which, axis=1)
    offset = jnp.clip(pos[None] - start, 0, segments.shape[-1] - 1)
    ids = segments[jnp.arange(n)[:, None], which, offset]
    mask = pos[None] < ends[:, -1:]
    return jnp.where(mask, ids, 0), mask


@functools.lru_cache(maxsize=16)
def _embedding_tables(embedder: HashedTextEmbedder) -> tuple[np.ndarray, np.ndarray]:
    """(len(CAPTION_VOCAB), dim) word vectors and (text_len, dim) scaled position codes."""
    words = np.stack([embedder._word_vector(w) for w in CAPTION_VOCAB]).astype(np.float32)
    code = embedder.position_scale * embedder._position_code(embedder.text_len)
    return words, code.astype(np.float32)


@functools.partial(jax.jit, static_argnames=("embedder",))
def caption_embeddings(scenes: Scenes, embedder: HashedTextEmbedder) -> tuple[jax.Array, jax.Array]:
    """`embedder([caption(spec) ...])` computed on device.

    The embedder sums word vector and position code in float64 before rounding; here both are
    rounded first and summed in float32, so entries differ from it by at most ~1 ulp.

    Returns:
        embeddings (n, text_len, dim) float32, zero past each caption's end, and mask
        (n, text_len) bool.
    """
    ids, mask = caption_ids(scenes, embedder.text_len)
    words, code = _embedding_tables(embedder)
    out = jnp.asarray(words)[ids] + jnp.asarray(code)[None]
    return jnp.where(mask[..., None], out, 0.0), mask
