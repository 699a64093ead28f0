"""Topology-aware alpha-beta model of collectives with link contention.

Given where every logical device sits (`perm[logical id] = chip index`), each collective is
turned into the point-to-point messages of its algorithm, every message is routed over the ICI
links (`Topology.route`), and the bytes are summed per *directed* link over all groups that run
at the same time. The time of a communication step is

    alpha_hop * (longest route in hops) + (busiest link's bytes) / link_bandwidth

Algorithms (s = per-device shard, n = group size, B = one-way link bandwidth):
- all-gather / reduce-scatter: a ring in replica-group order, n-1 steps, each member sending
  its shard to the next. The ring runs bidirectionally (half of each shard each way round)
  whenever that lowers the busiest link's load, otherwise one way: a closed unit-hop cycle
  always gains 2x; a strided ring (members 2 hops apart) gains where its return routes use
  links the forward routes leave idle; a line gains nothing (its closing edge already loads the
  reverse links). A full wrapped ring then costs ~ (n-1)*s/(2B) -> V/W_bidi; a 4-chip line without wrap-around
  costs 3*(s/B + 3*alpha_hop) because its closing edge runs back over the whole line.
- all-reduce: reduce-scatter + all-gather, i.e. twice the ring.
- all-to-all: every member sends V/n to every other member at once (all n(n-1) messages
  routed); latency alpha_op + (n-1)*alpha_hop*mean_hops.
- collective-permute: the listed (source, target) pairs, one step.
Every collective also pays `alpha_op` once.

`ring="best"` replaces the group order by a unit-hop Hamiltonian cycle of the members when they
form a box that has one (XLA's TPU ring-reordering may do similar); the default prices the
order the HLO states.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from vidax.planner.hlo import Collective
from vidax.planner.topology import Topology


@dataclasses.dataclass(frozen=True)
class CommCost:
    """Modelled time of one execution of a collective.

    Attributes:
        time: total seconds (`latency + transfer`).
        latency: alpha terms (per-op and per-hop), seconds.
        transfer: bandwidth terms (busiest link bytes / link bandwidth, summed over steps).
        max_link_bytes: bytes on the busiest directed link in one step.
        max_hops: longest route of any message, in hops.
        bidirectional: whether the rings ran both ways round (it lowered the busiest link).
    """

    time: float
    latency: float
    transfer: float
    max_link_bytes: float
    max_hops: int
    bidirectional: bool = False


ZERO = CommCost(0.0, 0.0, 0.0, 0.0, 0)


def link_loads(
    topology: Topology, messages: Sequence[tuple[int, int, float]]
) -> tuple[np.ndarray, int]:
    """Bytes per directed link and the longest route for concurrent `(src, dst, bytes)` messages.

    A message exactly half-way round a wrapped ring is split between both directions.
    """
    links: list[int] = []
    weights: list[float] = []
    max_hops = 0
    for src, dst, nbytes in messages:
        if src == dst:
            continue
        for path, share in topology.routes(src, dst):
            max_hops = max(max_hops, len(path))
            links.extend(path)
            weights.extend([nbytes * share] * len(path))
    loads = np.bincount(
        np.asarray(links, dtype=np.int64),
        weights=np.asarray(weights, dtype=np.float64),
        minlength=topology.num_link_slots,
    )
    return loads, max_hops


def _as_perm(perm: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    perm = np.asarray(perm, dtype=np.int64)
    if perm.shape != (n,) or sorted(perm.tolist()) != list(range(n)):
        raise ValueError(f"placement must be a permutation of {n} chips, got {perm.tolist()}")
    return perm


def ring_cost(
    topology: Topology,
    rings: Sequence[Sequence[int]],
    shard_bytes: float,
    *,
    alpha_op: float | None = None,
) -> CommCost:
    """All-gather-style ring over chip lists `rings` (all running at once), shard `shard_bytes`.

    Args:
        topology: the slice.
        rings: physical chip indices of each group, in ring order.
        shard_bytes: bytes each member forwards per step.
        alpha_op: per-collective cost (defaults to the chip's).
    """
    chip = topology.chip
    alpha_op = chip.alpha_op if alpha_op is None else alpha_op
    n = max((len(r) for r in rings), default=1)
    if n <= 1:
        return ZERO
    one_way, both_ways = [], []
    for ring in rings:
        edges = [(ring[k], ring[(k + 1) % len(ring)]) for k in range(len(ring))]
        one_way += [(a, b, shard_bytes) for a, b in edges]
        both_ways += [(a, b, shard_bytes / 2) for a, b in edges]
        both_ways += [(b, a, shard_bytes / 2) for a, b in edges]
    # The library runs one algorithm for all groups: half of every shard each way round when
    # that lowers the busiest link (always on a unit-hop cycle; also on strided rings whose
    # return routes use idle links), else the whole shard one way (e.g. a line, whose closing
    # edge already loads the reverse links).
    loads, max_hops = link_loads(topology, one_way)
    bidi_loads, bidi_hops = link_loads(topology, both_ways)
    all_bidi = bool(bidi_loads.max() < loads.max() * (1 - 1e-9))
    if all_bidi:
        loads, max_hops = bidi_loads, bidi_hops
    step_transfer = loads.max() / chip.link_bandwidth
    latency = alpha_op + (n - 1) * chip.alpha_hop * max_hops
    transfer = (n - 1) * step_transfer
    return CommCost(latency + transfer, latency, transfer, float(loads.max()), max_hops, all_bidi)


def all_to_all_cost(
    topology: Topology, groups: Sequence[Sequence[int]], buffer_bytes: float
) -> CommCost:
    """All-to-all within each group of physical chips; each member holds `buffer_bytes`."""
    chip = topology.chip
    n = max((len(g) for g in groups), default=1)
    if n <= 1:
        return ZERO
    chunk = buffer_bytes / n
    messages = [(a, b, chunk) for g in groups for a in g for b in g if a != b]
    loads, max_hops = link_loads(topology, messages)
    mean_hops = float(np.mean([topology.hops(a, b) for a, b, _ in messages]))
    latency = chip.alpha_op + (n - 1) * chip.alpha_hop * mean_hops
    transfer = loads.max() / chip.link_bandwidth
    return CommCost(latency + transfer, latency, transfer, float(loads.max()), max_hops)


def permute_cost(
    topology: Topology, pairs: Sequence[tuple[int, int]], buffer_bytes: float
) -> CommCost:
    """Collective-permute of `buffer_bytes` over physical `(source, target)` pairs."""
    chip = topology.chip
    messages = [(a, b, buffer_bytes) for a, b in pairs if a != b]
    if not messages:
        return ZERO
    loads, max_hops = link_loads(topology, messages)
    latency = chip.alpha_op + chip.alpha_hop * max_hops
    transfer = loads.max() / chip.link_bandwidth
    return CommCost(latency + transfer, latency, transfer, float(loads.max()), max_hops)


def collective_cost(
    collective: Collective,
    topology: Topology,
    perm: Sequence[int] | np.ndarray,
    *,
    ring: str = "group",
) -> CommCost:
    """Modelled time of one execution of `collective` when logical device i sits on `perm[i]`.

    Args:
        collective: a parsed collective (`vidax.planner.hlo`); its ids are logical.
        topology: the slice.
        perm: chip index of every logical device (length = devices in the program).
        ring: "group" (ring in replica-group order) or "best" (unit-hop cycle of the members
            where one exists).
    """
    if ring not in ("group", "best"):
        raise ValueError(f"ring must be 'group' or 'best', got {ring!r}")
    perm = _as_perm(perm, topology.num_devices)
    kind = collective.kind
    if kind == "collective-permute":
        pairs = [(int(perm[a]), int(perm[b])) for a, b in collective.pairs]
        return permute_cost(topology, pairs, collective.result_bytes)
    groups = [[int(perm[i]) for i in g] for g in collective.groups]
    n = max(len(g) for g in groups)
    if n <= 1:
        return ZERO
    if kind in ("all-to-all", "ragged-all-to-all"):
        return all_to_all_cost(topology, groups, collective.result_bytes)
    if ring == "best":
        groups = [best_ring(topology, g) for g in groups]
    if kind == "reduce-scatter":
        shard = (
            collective.operand_bytes / n if collective.operand_bytes else collective.result_bytes
        )
        return ring_cost(topology, groups, shard)
    shard = collective.result_bytes / n
    one = ring_cost(topology, groups, shard)
    if kind == "all-reduce":  # reduce-scatter then all-gather
        return dataclasses.replace(
            one, time=2 * one.time, latency=2 * one.latency, transfer=2 * one.transfer
        )
    return one  # all-gather, collective-broadcast


def grid_cycle(shape: tuple[int, int]) -> list[tuple[int, int]] | None:
    """A closed unit-hop Hamiltonian cycle of an `a x b` grid as (row, col) pairs, or None.

    Row 0 left to right, a snake over columns 1.. of the remaining rows, then back up column
    0: jax's `_TRAY_4x4_RING_ORDER` for 4x4. Exists iff a*b is even and both sides >= 2.
    """
    a, b = shape
    if a < 2 or b < 2 or (a * b) % 2:
        return None
    if a % 2:  # build on the transpose, whose row count is even
        transposed = grid_cycle((b, a))
        assert transposed is not None  # b x a passes the same checks
        return [(r, c) for c, r in transposed]
    out = [(0, c) for c in range(b)]
    for r in range(1, a):
        cols = range(b - 1, 0, -1) if r % 2 else range(1, b)
        out += [(r, c) for c in cols]
    out += [(r, 0) for r in range(a - 1, 0, -1)]
    return out


def best_ring(topology: Topology, chips: Sequence[int]) -> list[int]:
    """`chips` reordered into a unit-hop cycle when they fill a box of the slice that has one.

    Falls back to the given order (a box with no such cycle, or members that are not a box).
    """
    chips = list(chips)
    coords = topology.coords[chips]
    extent = [sorted(set(coords[:, k].tolist())) for k in range(topology.ndim)]
    if math.prod(len(e) for e in extent) != len(chips):
        return chips
    varying = [k for k in range(topology.ndim) if len(extent[k]) > 1]
    if not all(
        all(y - x == 1 for x, y in zip(extent[k], extent[k][1:], strict=False)) for k in varying
    ):
        return chips  # strided members: no unit-hop cycle inside the box
    by_coord = {tuple(c): chip for c, chip in zip(coords.tolist(), chips, strict=True)}
    if len(varying) == 1:
        k = varying[0]
        if topology.wrap[k] and len(extent[k]) == topology.dims[k]:
            return sorted(chips, key=lambda c: topology.coords[c][k])
        return chips
    if len(varying) != 2:
        return chips
    k0, k1 = varying
    cycle = grid_cycle((len(extent[k0]), len(extent[k1])))
    if cycle is None:
        return chips
    base = coords[0].copy()
    out = []
    for r, c in cycle:
        pos = base.copy()
        pos[k0], pos[k1] = extent[k0][r], extent[k1][c]
        out.append(by_coord[tuple(pos.tolist())])
    return out
