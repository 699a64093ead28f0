"""The AoiZora search: candidates -> stage 1 (estimate, prune) -> stage 2 (compile) -> stage 3
(physical placement) -> a ranked list and a `ShardingPlan`.

    result = plan(Workload(model="wan2.1-1.3b", frames=81, height=480, width=832), "v5e:4x4")
    print(result.table())
    result.best_plan().save("plan.json")

Stage 2 compiles each survivor once for the slice (compile-only TPU devices, libtpu) with the
mesh in jax's default device order: the compiled program does not depend on the order (only its
device assignment does), so stage 3 prices every placement of that logical mesh from the one
compiled HLO (`vidax.planner.placement`). Blocks are scanned, so a full-depth compile costs
about as much as a shallow one (measured: 24 s for 2 layers, 29 s for 30 on v5e:2x4) and the
planner compiles full depth: memory and loop trip counts are exact, nothing is extrapolated.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from vidax.planner.candidates import (
    ShardingCandidate,
    Workload,
    compile_checked,
    device_memory,
    enumerate_candidates,
)
from vidax.planner.estimate import Estimate, Pruned, abstract_step, candidate_mesh
from vidax.planner.estimate import estimate_candidate as _estimate
from vidax.planner.estimate import prune as _prune
from vidax.planner.hardware import GiB
from vidax.planner.hlo import HloAnalysis, analyze_hlo
from vidax.planner.placement import (
    Placement,
    PlacementScore,
    enumerate_placements,
    rank_placements,
)
from vidax.planner.topology import Topology, load_topology
from vidax.sharding.rules import use_mesh

PLAN_VERSION = 1
MAX_COMPILE = 3  # stage-2 compiles per search at most (20-60 s each on a small CPU host)


# ---- results ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Compiled:
    """Stage 2 for one candidate: its compiled program's analysis and memory."""

    candidate: ShardingCandidate
    estimate: Estimate
    analysis: HloAnalysis
    memory: int
    cost_analysis: dict
    seconds: float
    cached: bool = False


@dataclasses.dataclass(frozen=True)
class Row:
    """One ranked (logical candidate, placement) pair."""

    compiled: Compiled
    score: PlacementScore
    default: PlacementScore  # jax's default placement of the same logical mesh

    @property
    def candidate(self) -> ShardingCandidate:
        return self.compiled.candidate

    @property
    def placement(self) -> Placement:
        return self.score.placement


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """Everything a search produced, best first."""

    workload: Workload
    topology: Topology
    candidates: tuple[ShardingCandidate, ...]
    stage1: Pruned
    compiled: tuple[Compiled, ...]
    failures: tuple[tuple[ShardingCandidate, str], ...]  # survivors that did not compile / fit
    rows: tuple[Row, ...]  # best placement of every compiled candidate, fastest first
    placements_scored: int
    timings: dict[str, float]

    @property
    def best(self) -> Row:
        return self.rows[0]

    def logical_only(self) -> Row:
        """The best candidate when every mesh takes jax's default placement."""
        return min(self.rows, key=lambda r: r.default.total)

    def best_plan(self) -> ShardingPlan:
        return ShardingPlan.from_row(self.best, self)

    def table(self, top: int = 10) -> str:
        """The ranked table (candidate, placement, step latency, comm/compute, memory)."""
        head = (
            f"{'#':>2}  {'candidate':<32} {'placement':<34} {'step ms':>8} {'compute':>8} "
            f"{'comm':>7} {'comm%':>5} {'jax-def ms':>10} {'mem GiB':>7} {'pad%':>5}"
        )
        lines = [
            f"AoiZora plan: {self.workload.describe()} on {self.topology.name}",
            head,
            "-" * len(head),
        ]
        for i, row in enumerate(self.rows[:top]):
            s = row.score
            lines.append(
                f"{i + 1:>2}  {row.candidate.name:<32} {_short(row.placement.name, 34):<34} "
                f"{s.total * 1e3:>8.1f} {s.compute * 1e3:>8.1f} {s.communication * 1e3:>7.1f} "
                f"{100 * s.communication / s.total:>5.1f} {row.default.total * 1e3:>10.1f} "
                f"{row.compiled.memory / GiB:>7.2f} {100 * row.compiled.estimate.padding:>5.2f}"
            )
        t = self.timings
        lines.append(
            f"{len(self.candidates)} candidates -> {self.stage1.summary().split(': ', 1)[1]}; "
            f"compiled {len(self.compiled)} ({len(self.failures)} failed); "
            f"{self.placements_scored} placements scored; "
            f"{t['stage1']:.1f} s estimate + {t['stage2']:.1f} s compile + "
            f"{t['stage3']:.1f} s placement = {t['total']:.1f} s"
        )
        return "\n".join(lines)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# ---- the plan file ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingPlan:
    """What `vidax generate --plan` needs: a strategy and a mesh over the slice's chips.

    Attributes:
        model, workload: what it was planned for (informational).
        topology: the slice, e.g. "v5e:4x4".
        strategy: a `vidax.sharding` strategy name (composed names included).
        axis_names / mesh_shape: the logical mesh.
        placement: the placement's name.
        chips: chip index (x fastest) of each logical device, row-major over the mesh.
        coords: that chip's coordinates, to find it among real TPU devices.
        estimate: modelled step seconds (total, compute, communication) and bytes per device.
    """

    model: str
    workload: dict
    topology: str
    strategy: str
    axis_names: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    placement: str
    chips: tuple[int, ...]
    coords: tuple[tuple[int, ...], ...]
    estimate: dict
    version: int = PLAN_VERSION

    def __post_init__(self):
        n = math.prod(self.mesh_shape)
        if len(self.axis_names) != len(self.mesh_shape):
            raise ValueError(f"plan: {self.axis_names} do not name mesh shape {self.mesh_shape}")
        if sorted(self.chips) != list(range(n)) or len(self.coords) != n:
            raise ValueError(f"plan: chips must be a permutation of {n} chips with coordinates")

    @classmethod
    def from_row(cls, row: Row, result: PlanResult) -> ShardingPlan:
        topo = result.topology
        perm = row.placement.perm
        return cls(
            model=result.workload.model,
            workload=dataclasses.asdict(result.workload),
            topology=topo.name,
            strategy=row.candidate.strategy.name,
            axis_names=row.candidate.axis_names,
            mesh_shape=row.candidate.mesh_shape,
            placement=row.placement.name,
            chips=tuple(int(p) for p in perm),
            coords=tuple(tuple(int(c) for c in topo.coords[p]) for p in perm),
            estimate={
                "step_s": row.score.total,
                "compute_s": row.score.compute,
                "communication_s": row.score.communication,
                "jax_default_step_s": row.default.total,
                "memory_bytes": row.compiled.memory,
                "padded_token_fraction": row.compiled.estimate.padding,
            },
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ShardingPlan:
        """Reads a plan file; raises ValueError naming what is wrong with it."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"plan file not found: {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"plan file {path} is not JSON: {e}") from None
        if not isinstance(data, dict) or data.get("version") != PLAN_VERSION:
            raise ValueError(
                f"plan file {path}: expected version {PLAN_VERSION}, got "
                f"{data.get('version') if isinstance(data, dict) else type(data).__name__}"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(data) - {"version"}
        if missing:
            raise ValueError(f"plan file {path} lacks {sorted(missing)}")
        data = {k: v for k, v in data.items() if k in fields}
        for key in ("axis_names", "mesh_shape", "chips"):
            data[key] = tuple(data[key])
        data["coords"] = tuple(tuple(c) for c in data["coords"])
        return cls(**data)


# ---- the search ------------------------------------------------------------------------------
def compile_candidate(
    workload: Workload,
    candidate: ShardingCandidate,
    topology: Topology,
    estimate: Estimate,
    *,
    cache_dir: str | Path | None = None,
) -> Compiled:
    """Stage 2 for one candidate: compile for the slice, analyse the HLO, check HBM.

    Args:
        workload, candidate, topology: what to compile.
        estimate: its stage-1 estimate (kept with the result).
        cache_dir: where compiled programs are kept (HLO text, memory and cost analysis),
            keyed by a hash of the lowered program and the jax/libtpu versions, so a model
            change is never served a stale entry. None compiles every time.

    Raises:
        ValueError: if the compiled program does not fit the chip's HBM (or a kernel's SMEM).
    """
    start = time.perf_counter()
    mesh = candidate_mesh(candidate, topology.devices)
    with use_mesh(mesh, candidate.strategy) as mesh:
        step, args = abstract_step(workload, mesh, candidate.strategy)
        lowered = step.lower(*args)
    entry = None
    if cache_dir is not None:
        key = _cache_key(lowered.as_text(), topology)
        entry = Path(cache_dir) / f"{key}.json.gz"
        if entry.exists():
            data = json.loads(gzip.decompress(entry.read_bytes()))
            return Compiled(
                candidate=candidate,
                estimate=estimate,
                analysis=analyze_hlo(data["hlo"]),
                memory=data["memory"],
                cost_analysis=data["cost"],
                seconds=time.perf_counter() - start,
                cached=True,
            )
    compiled = compile_checked(lowered, topology.chip)
    memory = device_memory(compiled)
    if memory > topology.chip.hbm_bytes:
        raise ValueError(
            f"needs {memory / GiB:.2f} GiB per chip, {topology.chip.name} has "
            f"{topology.chip.hbm_bytes / GiB:.2f} GiB"
        )
    text = compiled.as_text()
    cost = compiled.cost_analysis() or {}
    cost = {k: float(v) for k, v in cost.items() if k in ("flops", "bytes accessed")}
    if entry is not None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        payload = {"hlo": text, "memory": memory, "cost": cost}
        entry.write_bytes(gzip.compress(json.dumps(payload).encode()))
    return Compiled(
        candidate=candidate,
        estimate=estimate,
        analysis=analyze_hlo(text),
        memory=memory,
        cost_analysis=cost,
        seconds=time.perf_counter() - start,
    )


def _cache_key(stablehlo: str, topology: Topology) -> str:
    import importlib.metadata

    import jax

    try:
        libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = "none"
    text = "\n".join((stablehlo, topology.name, jax.__version__, libtpu))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def rank_compiled(
    compiled: Compiled, topology: Topology, *, limit: int = 2000, ring: str = "group"
) -> tuple[list[PlacementScore], PlacementScore]:
    """Stage 3 for one compiled candidate: every placement scored, and jax's default's score."""
    candidate = compiled.candidate
    placements = enumerate_placements(
        topology, candidate.mesh_shape, axis_names=candidate.axis_names, limit=limit
    )
    compute = compiled.analysis.compute_time(topology.chip.peak_flops, topology.chip.hbm_bandwidth)
    ranked = rank_placements(
        compiled.analysis, topology, placements, compute_time=compute, ring=ring
    )
    default = next(s for s in ranked if s.placement.name.startswith("jax-default"))
    return ranked, default


def plan(
    workload: Workload,
    topology: str | Topology,
    *,
    keep: int | None = None,
    max_compile: int = MAX_COMPILE,
    sequence_modes: Sequence[str] = ("gather", "ulysses", "ring"),
    weight_modes: Sequence[str] = ("replicated", "fsdp"),
    candidates: Sequence[ShardingCandidate] | None = None,
    placement_limit: int = 2000,
    ring: str = "group",
    cache_dir: str | Path | None = None,
    log=None,
) -> PlanResult:
    """Searches sharding plans for one denoising step of `workload` on a TPU slice.

    Args:
        workload: model preset and video size.
        topology: a slice such as "v5e:4x4" (compile-only devices, needs libtpu) or a Topology.
        keep: candidates compiled in stage 2 (default: a fifth of the candidates, at most
            `max_compile`, at least 1).
        max_compile: cap on the default `keep`.
        sequence_modes / weight_modes: restrict the candidate space.
        candidates: an explicit candidate list instead of `enumerate_candidates`.
        placement_limit: placements enumerated per logical mesh.
        ring: ring model of the placement scoring ("group" or "best", `comm.collective_cost`).
        cache_dir: reuse compiled programs from here (see `compile_candidate`).
        log: optional callable receiving progress lines.

    Returns:
        A `PlanResult`; `.best_plan()` is what `vidax plan` writes.

    Raises:
        ValueError: for a bad topology string, a chip count no candidate fits, or a model that
            does not fit in HBM on the slice (with the numbers).
    """
    say = log or (lambda _: None)
    t0 = time.perf_counter()
    topo = load_topology(topology) if isinstance(topology, str) else topology
    if candidates is None:
        candidates = enumerate_candidates(
            workload, topo.num_devices, sequence_modes=sequence_modes, weight_modes=weight_modes
        )
    candidates = tuple(candidates)
    for c in candidates:
        if c.num_devices != topo.num_devices:
            raise ValueError(
                f"candidate {c.name} uses {c.num_devices} chips, {topo.name} has {topo.num_devices}"
            )
    if keep is None:
        keep = max(1, min(max_compile, len(candidates) // 5))
    say(f"{workload.describe()} on {topo.name}: {len(candidates)} candidates")

    estimates = [_estimate(workload, c, topo.devices, topo.chip) for c in candidates]
    stage1 = _prune(estimates, topo.chip, keep=keep)
    t1 = time.perf_counter()
    say(f"{stage1.summary()} ({t1 - t0:.1f} s)")

    compiled: list[Compiled] = []
    failures = []
    for est in stage1.survivors:
        try:
            done = compile_candidate(workload, est.candidate, topo, est, cache_dir=cache_dir)
        except ValueError as e:
            failures.append((est.candidate, str(e)))
            say(f"  {est.candidate.name}: {e}")
            continue
        compiled.append(done)
        how = "from the cache" if done.cached else "compiled"
        say(f"  {how} {est.candidate.name} in {done.seconds:.1f} s, {done.memory / GiB:.2f} GiB")
    t2 = time.perf_counter()
    if not compiled:
        raise ValueError(
            f"none of the {len(stage1.survivors)} candidates kept for {workload.describe()} "
            f"fits on {topo.name}: " + "; ".join(f"{c.name}: {why}" for c, why in failures)
        )

    rows, scored = [], 0
    for done in compiled:
        ranked, default = rank_compiled(done, topo, limit=placement_limit, ring=ring)
        scored += len(ranked)
        rows.append(Row(compiled=done, score=ranked[0], default=default))
    rows.sort(key=lambda r: r.score.total)
    t3 = time.perf_counter()
    say(f"stage 3: {scored} placements scored ({t3 - t2:.1f} s)")
    return PlanResult(
        workload=workload,
        topology=topo,
        candidates=candidates,
        stage1=stage1,
        compiled=tuple(compiled),
        failures=tuple(failures),
        rows=tuple(rows),
        placements_scored=scored,
        timings={"stage1": t1 - t0, "stage2": t2 - t1, "stage3": t3 - t2, "total": t3 - t0},
    )
