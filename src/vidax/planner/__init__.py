"""AoiZora: topology-aware sharding planner for TPU slices.

The search (`plan`) enumerates logical candidates for a Wan step (`enumerate_candidates`),
prunes them from their traced programs without compiling (stage 1, `vidax.planner.estimate`),
compiles the survivors for the slice (stage 2), prices every physical placement of each
(stage 3) and writes the best as a `ShardingPlan` that `load_plan` turns into a `Mesh` and strategy:

    result = plan(Workload(model="wan2.1-1.3b", frames=81, height=480, width=832), "v5e:4x4")
    result.best_plan().save("plan.json")
    mesh, strategy = load_plan("plan.json")

One compile of a step for a logical mesh on compile-only TPU devices gives the collectives the
program runs (`analyze_hlo`); the planner then prices every physical placement of that mesh on
the slice with a link-contention model (`collective_cost`) and realises the best one as an
ordinary `jax.sharding.Mesh` (`realize`). Model code does not change.

    topo = load_topology("v5e:4x4")
    mesh = realize(placement, topo, ("data", "seq"))   # any Placement of a (4, 4) mesh
    compiled = jax.jit(step).lower(*abstract_args(mesh)).compile()
    analysis = analyze_hlo(compiled.as_text())
    best = rank_placements(analysis, topo, enumerate_placements(topo, (4, 4)))[0]
"""

from vidax.planner.candidates import (
    ShardingCandidate,
    Workload,
    check_fits,
    compile_checked,
    device_memory,
    enumerate_candidates,
    mesh_shapes,
    padded_length,
)
from vidax.planner.comm import CommCost, best_ring, collective_cost, grid_cycle, link_loads
from vidax.planner.command import load_plan, realize_plan, register
from vidax.planner.estimate import Estimate, Pruned, estimate_candidate, prune
from vidax.planner.hardware import CHIPS, Chip, get_chip
from vidax.planner.hlo import (
    Collective,
    HloAnalysis,
    OpCost,
    analyze_hlo,
    expand_iota,
    parse_module,
    parse_replica_groups,
)
from vidax.planner.placement import (
    Placement,
    PlacementScore,
    compute_time_from_cost_analysis,
    enumerate_placements,
    jax_default_placement,
    rank_placements,
    realize,
    score_placement,
)
from vidax.planner.search import PlanResult, ShardingPlan, plan
from vidax.planner.topology import Topology, load_topology, parse_topology, synthetic_topology

__all__ = [
    "CHIPS",
    "Chip",
    "Collective",
    "CommCost",
    "Estimate",
    "HloAnalysis",
    "OpCost",
    "Placement",
    "PlacementScore",
    "PlanResult",
    "Pruned",
    "ShardingCandidate",
    "ShardingPlan",
    "Topology",
    "Workload",
    "analyze_hlo",
    "best_ring",
    "check_fits",
    "collective_cost",
    "compile_checked",
    "compute_time_from_cost_analysis",
    "device_memory",
    "enumerate_candidates",
    "enumerate_placements",
    "estimate_candidate",
    "expand_iota",
    "get_chip",
    "grid_cycle",
    "jax_default_placement",
    "link_loads",
    "load_plan",
    "load_topology",
    "mesh_shapes",
    "padded_length",
    "parse_module",
    "parse_replica_groups",
    "parse_topology",
    "plan",
    "prune",
    "rank_placements",
    "realize",
    "realize_plan",
    "register",
    "score_placement",
    "synthetic_topology",
]
