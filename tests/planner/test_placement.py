"""Placement enumeration, scoring, ranking and realisation as a jax Mesh."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vidax.planner import (
    Placement,
    analyze_hlo,
    enumerate_placements,
    jax_default_placement,
    rank_placements,
    realize,
    score_placement,
    synthetic_topology,
)
from vidax.planner.placement import _canonical, _symmetries

CASES = [
    ("v5e:2x2", (2, 2)),
    ("v5e:2x2", (4,)),
    ("v5e:2x4", (2, 4)),
    ("v5e:2x4", (8,)),
    ("v5e:4x4", (4, 4)),
    ("v5e:4x4", (2, 8)),
    ("v5e:4x4", (16,)),
    ("v5e:4x8", (4, 8)),
    ("v5e:4x8", (2, 4, 4)),
    ("v6e:4x4", (2, 2, 4)),
    ("v5p:2x2x4", (4, 4)),
]


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_placements_are_distinct_permutations_of_all_chips(name, shape):
    topo = synthetic_topology(name)
    placements = enumerate_placements(topo, shape)
    assert len(placements) >= 2
    symmetries = _symmetries(topo)
    keys = set()
    for p in placements:
        assert p.mesh_shape == shape
        assert sorted(p.perm) == list(range(topo.num_devices))
        assert p.devices(topo).shape == shape
        keys.add(_canonical(topo, np.asarray(p.perm), symmetries))
    assert len(keys) == len(placements)  # no two equal up to a symmetry of the slice
    assert placements[0].name.startswith("jax-default")


def test_enumeration_covers_splits_and_cycles():
    topo = synthetic_topology("v5e:4x4")
    placements = enumerate_placements(topo, (4, 4), axis_names=("data", "seq"))
    hops = {p.name: p.axis_hops(topo) for p in placements}
    # Some placement puts `seq` on unit-hop 4-cycles (2x2 blocks), impossible without splits.
    assert any(h[1] == (1, 1.0) for h in hops.values())
    # An 8-chip axis as a closed cycle around a 2x4 block (jax's split gives 4-hop edges).
    wide = enumerate_placements(topo, (2, 8), axis_names=("data", "seq"))
    cycles = [p for p in wide if "seq=" in p.name and "cycle" in p.name.split("seq=")[1]]
    assert any(p.axis_hops(topo)[1] == (1, 1.0) for p in cycles)
    assert wide[0].axis_hops(topo)[1][0] > 1
    assert hops[placements[0].name] == [(3, 1.5), (3, 1.5)]  # jax: two 4-chip lines
    with pytest.raises(ValueError, match="16 chips"):
        enumerate_placements(topo, (4, 8))
    with pytest.raises(ValueError, match="traversal"):
        enumerate_placements(topo, (4, 4), traversals=("spiral",))
    with pytest.raises(ValueError, match="permutation"):
        Placement("bad", (2, 2), (0, 0, 1, 2))


def _analysis(text_groups: str, kind="all-gather", n=16, nbytes=64 << 20) -> object:
    """An analysis of one step with a single collective over `text_groups`."""
    shape = f"bf16[{nbytes // 2}]"
    extra = ", dimensions={0}" if kind == "all-gather" else ", to_apply=%add"
    text = f"""HloModule m, num_partitions={n}

%add (a: bf16[], b: bf16[]) -> bf16[] {{
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %s = bf16[] add(%a, %b)
}}

ENTRY %main (x: {shape}) -> {shape} {{
  %x = {shape}{{0}} parameter(0)
  ROOT %c = {shape}{{0}} {kind}(%x), channel_id=1, replica_groups={text_groups}, use_global_device_ids=true{extra}
}}
"""
    return analyze_hlo(text)


def test_model_prefers_unit_hop_rings_on_unwrapped_slices():
    topo = synthetic_topology("v5e:4x4")
    analysis = _analysis("[4,4]<=[16]")  # gathers over the minor mesh axis
    placements = enumerate_placements(topo, (4, 4))
    ranked = rank_placements(analysis, topo, placements)
    best, default = ranked[0], next(s for s in ranked if s.placement.name == "jax-default")
    assert best.placement.axis_hops(topo)[1] == (1, 1.0)
    assert best.total < 0.6 * default.total  # bidirectional cycles vs 3-hop closing edges
    assert [s.total for s in ranked] == sorted(s.total for s in ranked)
    assert best.compute == 0.0 and best.communication == best.collectives[0].exposed


def test_no_gain_claimed_where_jax_default_is_already_a_ring():
    topo = synthetic_topology("v5e:16x16")
    analysis = _analysis("[16,16]<=[256]", n=256)
    ranked = rank_placements(analysis, topo, enumerate_placements(topo, (16, 16), limit=60))
    default = next(s for s in ranked if s.placement.name == "jax-default")
    assert default.total == pytest.approx(ranked[0].total)


def test_async_window_hides_communication_behind_compute():
    topo = synthetic_topology("v5e:2x2")
    sync = """HloModule m, num_partitions=4

%fused (p0: f32[1024,1024], p1: f32[1024,1024]) -> f32[1024,1024] {
  %p0 = f32[1024,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  ROOT %d = f32[1024,1024]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[256,1024], y: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[256,1024]{1,0} parameter(0)
  %y = f32[1024,1024]{1,0} parameter(1)
  %g = f32[1024,1024]{1,0} all-gather(%x), channel_id=1, replica_groups={{0,1,3,2}}, dimensions={0}, use_global_device_ids=true
  %f = f32[1024,1024]{1,0} fusion(%y, %y), kind=kOutput, calls=%fused
  ROOT %o = f32[1024,1024]{1,0} add(%g, %f)
}
"""
    overlapped = sync.replace(
        "%g = f32[1024,1024]{1,0} all-gather(%x)",
        "%s = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(%x)",
    ).replace(
        "ROOT %o = f32[1024,1024]{1,0} add(%g, %f)",
        "%g = f32[1024,1024]{1,0} all-gather-done(%s)\n  ROOT %o = f32[1024,1024]{1,0} add(%g, %f)",
    )
    placement = jax_default_placement(topo, (4,))
    a_sync, a_async = analyze_hlo(sync), analyze_hlo(overlapped)
    s_sync = score_placement(a_sync, topo, placement)
    s_async = score_placement(a_async, topo, placement)
    comm = s_sync.collectives[0].cost.time
    window = a_async.ops[a_async.collectives[0].overlap[0]].time(
        topo.chip.peak_flops, topo.chip.hbm_bandwidth
    )
    assert s_sync.communication == pytest.approx(comm)
    assert s_async.communication == pytest.approx(max(0.0, comm - window))
    assert s_async.compute == pytest.approx(s_sync.compute) and s_async.total < s_sync.total
    assert score_placement(a_sync, topo, placement, compute_time=1.0).compute == 1.0
    with pytest.raises(ValueError, match="compiled for 4 devices"):
        score_placement(
            a_sync,
            synthetic_topology("v5e:2x4"),
            jax_default_placement(synthetic_topology("v5e:2x4"), (8,)),
        )


def test_realize_needs_real_devices_and_matching_names():
    topo = synthetic_topology("v5e:2x2")
    placement = enumerate_placements(topo, (2, 2))[0]
    with pytest.raises(ValueError, match="synthetic"):
        realize(placement, topo, ("a", "b"))


# ---- compile-only TPU topologies -------------------------------------------------------------
@pytest.mark.tpu_aot
@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("v5e:2x2", (2, 2)),
        ("v5e:2x4", (2, 4)),
        ("v5e:4x4", (4, 4)),
        ("v5e:4x8", (4, 8)),
        ("v6e:4x4", (2, 8)),
    ],
)
def test_plan_a_compiled_step(tpu_topology, name, shape):
    topo = tpu_topology(name)
    axes = ("data", "model")
    placements = enumerate_placements(topo, shape, axis_names=axes)
    # jax's default is in the set, exactly as mesh_utils builds it for these devices.
    try:
        jax_grid, expected = mesh_utils.create_device_mesh(shape, list(topo.devices)), "jax-default"
    except NotImplementedError:  # jax needs permission to split physical axes
        jax_grid = mesh_utils.create_device_mesh(
            shape, list(topo.devices), allow_split_physical_axes=True
        )
        expected = "jax-default(split)"
    default = placements[0]
    assert default.name == expected
    assert [d.id for d in default.devices(topo).ravel()] == [d.id for d in jax_grid.ravel()]

    mesh = realize(default, topo, axes)
    assert mesh.devices.shape == shape and mesh.axis_names == axes

    def step(x, w1, w2):
        h = jax.nn.relu(x @ w1)  # tensor-parallel MLP: all-reduce over `model`
        y = jax.lax.with_sharding_constraint(h @ w2, NamedSharding(mesh, P("data", None)))
        return jnp.mean(y * y)  # a scalar loss: all-reduce over `data`

    def sds(shape_, spec):
        return jax.ShapeDtypeStruct(shape_, jnp.bfloat16, sharding=NamedSharding(mesh, spec))

    compiled = (
        jax.jit(step)
        .lower(
            sds((256, 512), P("data")),
            sds((512, 1024), P(None, "model")),
            sds((1024, 512), P("model")),
        )
        .compile()
    )
    analysis = analyze_hlo(compiled.as_text())
    assert analysis.num_devices == math.prod(shape)
    assert any(c.kind == "all-reduce" for c in analysis.collectives)
    ranked = rank_placements(analysis, topo, placements)
    assert len(ranked) == len(placements)
    assert ranked[0].total <= next(s.total for s in ranked if s.placement is default)
    assert all(np.isfinite(s.total) and s.total > s.compute > 0 for s in ranked)
    best = realize(ranked[0].placement, topo, axes)
    assert sorted(d.id for d in best.devices.ravel()) == sorted(d.id for d in topo.devices)


def test_collectives_in_flight_together_share_the_window():
    topo = synthetic_topology("v5e:2x2")
    text = """HloModule m, num_partitions=4

%fused (p0: f32[1024,1024], p1: f32[1024,1024]) -> f32[1024,1024] {
  %p0 = f32[1024,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  ROOT %d = f32[1024,1024]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[256,1024], y: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[256,1024]{1,0} parameter(0)
  %y = f32[1024,1024]{1,0} parameter(1)
  %s1 = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(%x), channel_id=1, replica_groups={{0,1,3,2}}, dimensions={0}, use_global_device_ids=true
  %s2 = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(%x), channel_id=2, replica_groups={{0,1,3,2}}, dimensions={0}, use_global_device_ids=true
  %f = f32[1024,1024]{1,0} fusion(%y, %y), kind=kOutput, calls=%fused
  %g1 = f32[1024,1024]{1,0} all-gather-done(%s1)
  %g2 = f32[1024,1024]{1,0} all-gather-done(%s2)
  %a = f32[1024,1024]{1,0} add(%g1, %g2)
  ROOT %o = f32[1024,1024]{1,0} add(%a, %f)
}
"""
    analysis = analyze_hlo(text)
    assert [len(c.overlap) for c in analysis.collectives] == [1, 1]
    placement = jax_default_placement(topo, (4,))
    score = score_placement(analysis, topo, placement)
    one = score.collectives[0].cost.time
    window = analysis.ops[analysis.collectives[0].overlap[0]].time(
        topo.chip.peak_flops, topo.chip.hbm_bandwidth
    )
    assert 0 < window < one  # the window hides part of one gather, none of the other
    assert score.communication == pytest.approx(2 * one - window)
    assert sorted(c.exposed for c in score.collectives) == pytest.approx([one - window, one])
