"""AoiZora: topology-aware sharding planner for TPU slices.

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
    check_fits,
    compile_checked,
    device_memory,
    mesh_shapes,
    padded_length,
)
from vidax.planner.comm import CommCost, best_ring, collective_cost, grid_cycle, link_loads
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
from vidax.planner.topology import Topology, load_topology, parse_topology, synthetic_topology

__all__ = [
    "CHIPS",
    "Chip",
    "Collective",
    "CommCost",
    "HloAnalysis",
    "OpCost",
    "Placement",
    "PlacementScore",
    "Topology",
    "analyze_hlo",
    "best_ring",
    "check_fits",
    "collective_cost",
    "compile_checked",
    "compute_time_from_cost_analysis",
    "device_memory",
    "enumerate_placements",
    "expand_iota",
    "get_chip",
    "grid_cycle",
    "jax_default_placement",
    "link_loads",
    "load_topology",
    "mesh_shapes",
    "padded_length",
    "parse_module",
    "parse_replica_groups",
    "parse_topology",
    "rank_placements",
    "realize",
    "score_placement",
    "synthetic_topology",
]
