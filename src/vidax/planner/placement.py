"""Physical placements of a logical mesh on a TPU slice, their scores and realisation.

A placement is a permutation `perm` of the slice's chips: logical device `i` (row-major
position in the mesh, i.e. the id the compiled HLO's replica groups use) runs on chip
`perm[i]`. The compiled program is identical for every placement of one logical mesh (only its
device assignment changes), so one compile prices all of them.

Enumeration (`enumerate_placements`) builds each candidate from three choices:
1. factors: how every logical axis splits over the physical dimensions (`F[i][j]`, rows
   multiplying to the axis sizes, columns to the slice dimensions): whole axes, or splits such
   as a size-4 axis on a 2x2 block;
2. nesting: inside each physical dimension, which logical axis takes the minor (contiguous)
   digit and which the strided ones;
3. traversal: how an axis walks its own sub-grid: row-major (with either dimension major),
   snake (boustrophedon), a closed unit-hop cycle (`comm.grid_cycle`, jax's tray ring) or, on
   a 1D line, the folded ring 0,2,4,...,5,3,1 (no long closing edge).
Candidates equal up to a symmetry of the slice (reflections, transposes of equal dimensions
with equal wrap-around) are kept once. jax's own choice
(`jax.experimental.mesh_utils.create_device_mesh`) is always included as "jax-default".

Scoring (`score_placement`) adds the step's compute time (per-op roofline from the HLO) to the
communication that is not hidden: a synchronous collective is fully exposed, an async one only
beyond the compute scheduled inside its start/done window; collectives in flight together share
that compute (each op's time hides communication once, earliest-started collective first).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from vidax.planner.comm import CommCost, collective_cost, grid_cycle
from vidax.planner.hlo import HloAnalysis
from vidax.planner.topology import Topology

_DIM_NAMES = "xyz"
TRAVERSALS = ("row", "snake", "cycle", "fold")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Logical device `i` (row-major in `mesh_shape`) runs on chip `perm[i]`."""

    name: str
    mesh_shape: tuple[int, ...]
    perm: tuple[int, ...]

    def __post_init__(self):
        n = math.prod(self.mesh_shape)
        if sorted(self.perm) != list(range(n)):
            raise ValueError(f"placement {self.name!r}: perm is not a permutation of {n} chips")

    def devices(self, topology: Topology) -> np.ndarray:
        """The device array of shape `mesh_shape` for `jax.sharding.Mesh`."""
        return np.array(topology.devices, dtype=object)[list(self.perm)].reshape(self.mesh_shape)

    def axis_hops(self, topology: Topology) -> list[tuple[int, float]]:
        """(max, mean) hops between ring neighbours along each mesh axis, closing edge included."""
        grid = np.asarray(self.perm).reshape(self.mesh_shape)
        out = []
        for axis, size in enumerate(self.mesh_shape):
            if size == 1:
                out.append((0, 0.0))
                continue
            nxt = np.roll(grid, -1, axis=axis)
            hops = [topology.hops(a, b) for a, b in zip(grid.ravel(), nxt.ravel(), strict=True)]
            out.append((int(max(hops)), float(np.mean(hops))))
        return out


def realize(placement: Placement, topology: Topology, axis_names: Sequence[str]):
    """An ordinary `jax.sharding.Mesh` over the placement's device order.

    Raises:
        ValueError: if the topology has synthetic devices or the names do not match the shape.
    """
    from jax.sharding import Mesh

    if topology.synthetic:
        raise ValueError(
            f"{topology.name} has synthetic devices; use load_topology(...) for a real Mesh"
        )
    if len(axis_names) != len(placement.mesh_shape):
        raise ValueError(f"{len(axis_names)} axis names for mesh shape {placement.mesh_shape}")
    return Mesh(placement.devices(topology), tuple(axis_names))


def jax_default_placement(topology: Topology, mesh_shape: Sequence[int]) -> Placement:
    """jax's `create_device_mesh` order for this slice and mesh shape.

    Where jax needs to split a physical axis (e.g. a (2, 8) mesh on 4x4) it refuses unless
    `allow_split_physical_axes=True`; that retry is named "jax-default(split)".
    """
    from jax.experimental import mesh_utils

    mesh_shape = tuple(int(m) for m in mesh_shape)
    name = "jax-default"
    try:
        grid = mesh_utils.create_device_mesh(mesh_shape, list(topology.devices))
    except (NotImplementedError, ValueError):
        grid = mesh_utils.create_device_mesh(
            mesh_shape, list(topology.devices), allow_split_physical_axes=True
        )
        name = "jax-default(split)"
    index = {d.id: i for i, d in enumerate(topology.devices)}
    return Placement(name, mesh_shape, tuple(index[d.id] for d in grid.ravel()))


# ---- enumeration -----------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factor_matrices(mesh_shape, dims) -> Iterator[tuple[tuple[int, ...], ...]]:
    """All F with rows multiplying to mesh_shape[i] and columns to dims[j]."""

    def rows(i, caps):
        if i == len(mesh_shape):
            if all(c == 1 for c in caps):
                yield ()
            return
        for row in _row_choices(mesh_shape[i], caps):
            rest = tuple(c // f for c, f in zip(caps, row, strict=True))
            for tail in rows(i + 1, rest):
                yield (row, *tail)

    yield from rows(0, tuple(dims))


def _row_choices(m, caps, j=0):
    if j == len(caps):
        if m == 1:
            yield ()
        return
    for f in _divisors(caps[j]):
        if m % f == 0:
            for tail in _row_choices(m // f, caps, j + 1):
                yield (f, *tail)


def _traversal(shape: tuple[int, ...], kind: str, major: tuple[int, ...]) -> np.ndarray | None:
    """Digits `(n, len(shape))` visited in order when walking a sub-grid of `shape`.

    `major` orders the sub-grid dimensions from major to minor (row-major / snake); the cycle
    uses the first two as (row, column).
    """
    n = math.prod(shape)
    ordered = tuple(shape[k] for k in major)
    if kind == "row":
        digits = np.stack(np.unravel_index(np.arange(n), ordered), axis=-1)
    elif kind == "snake":
        if len(shape) < 2:
            return None
        digits = np.stack(np.unravel_index(np.arange(n), ordered), axis=-1)
        # Reverse each minor digit whenever the sum of the more-major digits is odd.
        for k in range(1, len(ordered)):
            flip = digits[:, :k].sum(axis=1) % 2 == 1
            digits[flip, k] = ordered[k] - 1 - digits[flip, k]
    elif kind == "cycle":
        if len(shape) != 2:
            return None
        cyc = grid_cycle((ordered[0], ordered[1]))
        if cyc is None:
            return None
        digits = np.array(cyc)
    elif kind == "fold":
        if len(shape) != 1 or n < 4:
            return None
        order = list(range(0, n, 2)) + [i for i in range(n - 1, 0, -1) if i % 2]
        digits = np.array(order)[:, None]
    else:
        raise ValueError(f"unknown traversal {kind!r}; choose from {TRAVERSALS}")
    out = np.empty_like(digits)
    out[:, list(major)] = digits  # back to the sub-grid's own dimension order
    return out


def _symmetries(topology: Topology) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """(dimension permutation, reflections) pairs that map the slice onto itself."""
    dims, wrap = topology.dims, topology.wrap
    out = []
    for p in itertools.permutations(range(topology.ndim)):
        if all(dims[p[k]] == dims[k] and wrap[p[k]] == wrap[k] for k in range(topology.ndim)):
            for flips in itertools.product((False, True), repeat=topology.ndim):
                out.append((p, flips))
    return out


def _canonical(topology: Topology, perm: np.ndarray, symmetries) -> tuple[int, ...]:
    coords = topology.coords[perm]
    best = None
    strides = np.cumprod((1, *topology.dims[:-1]))
    for p, flips in symmetries:
        c = coords[:, list(p)].copy()
        for k, flip in enumerate(flips):
            if flip:
                c[:, k] = topology.dims[k] - 1 - c[:, k]
        key = tuple((c * strides).sum(axis=1).tolist())
        if best is None or key < best:
            best = key
    assert best is not None  # the identity (no permutation, no flip) is always a symmetry
    return best


def enumerate_placements(
    topology: Topology,
    mesh_shape: Sequence[int],
    *,
    axis_names: Sequence[str] | None = None,
    traversals: Sequence[str] = TRAVERSALS,
    include_default: bool = True,
    limit: int = 5000,
) -> list[Placement]:
    """Distinct placements of a logical mesh on `topology` (see the module docstring).

    Args:
        topology: the slice.
        mesh_shape: logical mesh shape; its product must equal the chip count.
        axis_names: names used in placement names (default a0, a1, ...).
        traversals: sub-grid walks to try, a subset of `TRAVERSALS`.
        include_default: add jax's `create_device_mesh` order as "jax-default".
        limit: stop after this many distinct placements.

    Returns:
        Placements, jax's default first (when included), then in enumeration order.

    Raises:
        ValueError: if the mesh does not use exactly the slice's chips.
    """
    mesh_shape = tuple(int(m) for m in mesh_shape)
    n = topology.num_devices
    if math.prod(mesh_shape) != n:
        raise ValueError(
            f"mesh shape {mesh_shape} has {math.prod(mesh_shape)} devices but {topology.name} "
            f"has {n} chips"
        )
    names = (
        list(axis_names) if axis_names is not None else [f"a{i}" for i in range(len(mesh_shape))]
    )
    if len(names) != len(mesh_shape):
        raise ValueError(f"{len(names)} axis names for mesh shape {mesh_shape}")
    for t in traversals:
        if t not in TRAVERSALS:
            raise ValueError(f"unknown traversal {t!r}; choose from {TRAVERSALS}")
    dims = topology.dims
    symmetries = _symmetries(topology)
    seen: dict[tuple[int, ...], int] = {}
    out: list[Placement] = []

    def add(placement: Placement) -> bool:
        key = _canonical(topology, np.asarray(placement.perm), symmetries)
        if key in seen:
            return False
        seen[key] = len(out)
        out.append(placement)
        return True

    if include_default:
        add(jax_default_placement(topology, mesh_shape))

    for fmat in _factor_matrices(mesh_shape, dims):
        # Per physical dim: orders (major -> minor) of the axes sharing it.
        sharing = [[i for i in range(len(mesh_shape)) if fmat[i][j] > 1] for j in range(len(dims))]
        nestings = itertools.product(*(itertools.permutations(s) for s in sharing))
        for nesting in nestings:
            # stride[i][j]: weight of axis i's digit in physical coordinate j.
            stride = [[0] * len(dims) for _ in mesh_shape]
            for j, order in enumerate(nesting):
                w = 1
                for i in reversed(order):
                    stride[i][j] = w
                    w *= fmat[i][j]
            per_axis = [list(_axis_walks(fmat[i], traversals)) for i in range(len(mesh_shape))]
            for walks in itertools.product(*per_axis):
                coords = np.zeros((*mesh_shape, len(dims)), dtype=np.int64)
                for i, (digits, _) in enumerate(walks):
                    contrib = digits * np.asarray(stride[i])  # (m_i, ndim)
                    shape = [1] * len(mesh_shape) + [len(dims)]
                    shape[i] = mesh_shape[i]
                    coords = coords + contrib.reshape(shape)
                flat = coords.reshape(-1, len(dims))
                perm = tuple(int(topology.index(c.tolist())) for c in flat)
                label = " ".join(
                    f"{names[i]}={_label(fmat[i], stride[i], desc)}"
                    for i, (_, desc) in enumerate(walks)
                    if mesh_shape[i] > 1
                )
                add(Placement(label or "trivial", mesh_shape, perm))
                if len(out) >= limit:
                    return out
    return out


def _axis_walks(row: tuple[int, ...], traversals) -> Iterator[tuple[np.ndarray, str]]:
    """(digits over all physical dims, description) for every walk of one axis's sub-grid."""
    used = [j for j, f in enumerate(row) if f > 1]
    shape = tuple(row[j] for j in used)
    emitted = set()
    if not used:
        yield np.zeros((1, len(row)), dtype=np.int64), "1"
        return
    for kind in traversals:
        for major in itertools.permutations(range(len(used))):
            if kind in ("fold",) and major != tuple(range(len(used))):
                continue
            sub = _traversal(shape, kind, major)
            if sub is None:
                continue
            key = sub.tobytes()
            if key in emitted:
                continue
            emitted.add(key)
            digits = np.zeros((sub.shape[0], len(row)), dtype=np.int64)
            digits[:, used] = sub
            order = "".join(_DIM_NAMES[used[k]] for k in major)
            yield digits, f"{kind}:{order}" if len(used) > 1 else kind


def _label(row, stride, desc) -> str:
    parts = []
    for j, f in enumerate(row):
        if f > 1:
            parts.append(f"{_DIM_NAMES[j]}{f}" + (f"/{stride[j]}" if stride[j] > 1 else ""))
    return "·".join(parts) + f"({desc})"


# ---- scoring ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CollectiveScore:
    name: str
    kind: str
    count: int
    cost: CommCost
    exposed: float  # seconds per execution not hidden behind compute


@dataclasses.dataclass(frozen=True)
class PlacementScore:
    """Modelled step time of one placement: `total = compute + communication` (exposed)."""

    placement: Placement
    compute: float
    communication: float
    collectives: tuple[CollectiveScore, ...]

    @property
    def total(self) -> float:
        return self.compute + self.communication


def score_placement(
    analysis: HloAnalysis,
    topology: Topology,
    placement: Placement,
    *,
    compute_time: float | None = None,
    ring: str = "group",
) -> PlacementScore:
    """Step time of the compiled program `analysis` under `placement`.

    Args:
        analysis: `hlo.analyze_hlo(compiled.as_text())` of one step.
        topology: the slice the program was compiled for.
        placement: where each logical device runs.
        compute_time: override the HLO roofline compute estimate (seconds per step), e.g.
            from `compute_time_from_cost_analysis`.
        ring: ring order model for AG/RS/AR, see `comm.collective_cost`.
    """
    chip = topology.chip
    if analysis.num_devices != topology.num_devices:
        raise ValueError(
            f"program was compiled for {analysis.num_devices} devices, {topology.name} has "
            f"{topology.num_devices}"
        )
    op_times = [op.time(chip.peak_flops, chip.hbm_bandwidth) for op in analysis.ops]
    compute = (
        sum(t * op.count for t, op in zip(op_times, analysis.ops, strict=True))
        if compute_time is None
        else compute_time
    )
    cache: dict = {}  # identical collectives (e.g. one per scanned layer) priced once
    costs = []
    for c in analysis.collectives:
        key = (c.signature, ring)
        if key not in cache:
            cache[key] = collective_cost(c, topology, placement.perm, ring=ring)
        costs.append(cache[key])
    # Compute inside an async window hides communication once: collectives in flight together
    # share it (earliest-started first) instead of each being credited the whole window.
    budget = list(op_times)
    exposed = [cost.time for cost in costs]
    order = sorted(
        (i for i, c in enumerate(analysis.collectives) if c.is_async and c.overlap),
        key=lambda i: min(analysis.collectives[i].overlap),
    )
    for i in order:
        for op in analysis.collectives[i].overlap:
            take = min(budget[op], exposed[i])
            budget[op] -= take
            exposed[i] -= take
            if exposed[i] <= 0.0:
                break
    scores, comm = [], 0.0
    for c, cost, e in zip(analysis.collectives, costs, exposed, strict=True):
        comm += e * c.count
        scores.append(CollectiveScore(c.name, c.kind, c.count, cost, e))
    return PlacementScore(placement, compute, comm, tuple(scores))


def rank_placements(
    analysis: HloAnalysis,
    topology: Topology,
    placements: Sequence[Placement],
    *,
    compute_time: float | None = None,
    ring: str = "group",
) -> list[PlacementScore]:
    """Scores every placement and sorts them, fastest first.

    Placements the model prices equally (often: only one axis communicates) are ordered by the
    mean ring-neighbour hops over all mesh axes, so traffic the model does not see (e.g. the
    optimizer's) lands on short routes too; remaining ties keep input order.
    """
    scores = [
        score_placement(analysis, topology, p, compute_time=compute_time, ring=ring)
        for p in placements
    ]

    def key(s: PlacementScore):
        hops = sum(mean for _, mean in s.placement.axis_hops(topology))
        return (float(f"{s.total:.9g}"), hops)

    return sorted(scores, key=key)


def compute_time_from_cost_analysis(cost: dict, peak_flops: float, hbm_bandwidth: float) -> float:
    """`max(flops / peak, bytes / HBM bandwidth)` from `compiled.cost_analysis()`.

    Counts while-loop bodies once (XLA's cost analysis does), so prefer the HLO roofline of
    `HloAnalysis.compute_time` for scanned models.
    """
    return max(
        float(cost.get("flops", 0.0)) / peak_flops,
        float(cost.get("bytes accessed", 0.0)) / hbm_bandwidth,
    )
