"""Alpha-beta link-contention model: the scaling book's sanity checks and contention."""

import numpy as np
import pytest

from vidax.planner import best_ring, collective_cost, grid_cycle, link_loads, synthetic_topology
from vidax.planner.comm import all_to_all_cost, permute_cost, ring_cost
from vidax.planner.hlo import Collective

MB = 1 << 20


def _row(topo, y):
    return [topo.index((x, y)) for x in range(topo.dims[0])]


def test_full_wrapped_ring_approaches_volume_over_bidirectional_bandwidth():
    topo = synthetic_topology("v5e:16x16")
    chip = topo.chip
    shard = 4 * MB
    # Every row of the torus gathers at once: rows use disjoint links.
    cost = ring_cost(topo, [_row(topo, y) for y in range(16)], shard)
    assert cost.bidirectional and cost.max_hops == 1
    assert cost.transfer == pytest.approx(15 * shard / (2 * chip.link_bandwidth))
    volume = 16 * shard
    assert cost.time == pytest.approx(volume / chip.bidirectional_link_bandwidth, rel=0.08)


def test_unwrapped_axis_of_four_costs_three_shards_over_one_link():
    topo = synthetic_topology("v5e:4x4")
    chip = topo.chip
    shard = 8.4e6  # the scaling book's example: 560 us modelled (680 us measured) on v5e
    cost = ring_cost(topo, [_row(topo, y) for y in range(4)], shard)
    assert not cost.bidirectional and cost.max_hops == 3
    assert cost.transfer == pytest.approx(3 * shard / chip.link_bandwidth)
    assert cost.transfer == pytest.approx(560e-6, rel=0.01)
    assert cost.latency == pytest.approx(chip.alpha_op + 3 * 3 * chip.alpha_hop)


def test_two_by_two_block_cycle_halves_the_line():
    topo = synthetic_topology("v5e:4x4")
    block = [topo.index(c) for c in ((0, 0), (1, 0), (1, 1), (0, 1))]
    line = _row(topo, 0)
    shard = 2 * MB
    cycle, straight = ring_cost(topo, [block], shard), ring_cost(topo, [line], shard)
    assert cycle.bidirectional and cycle.max_hops == 1
    assert cycle.transfer == pytest.approx(straight.transfer / 2)
    # Row order of the same block is not a cycle: one diagonal edge of two hops.
    row_order = [topo.index(c) for c in ((0, 0), (1, 0), (0, 1), (1, 1))]
    assert not ring_cost(topo, [row_order], shard).bidirectional
    reordered = best_ring(topo, row_order)
    assert sorted(reordered) == sorted(row_order)
    assert ring_cost(topo, [reordered], shard).transfer == pytest.approx(cycle.transfer)


def test_strided_rings_run_both_ways_when_that_relieves_shared_links():
    topo = synthetic_topology("v5e:4x4")
    chip = topo.chip
    shard = 2 * MB
    cycle = ((0, 0), (2, 0), (2, 2), (0, 2))  # a 2x2 cycle of chips two hops apart
    a = [topo.index(c) for c in cycle]
    b = [topo.index((x + 1, y)) for x, y in cycle]  # interleaved: shares a's x links
    alone, shared = ring_cost(topo, [a], shard), ring_cost(topo, [a, b], shard)
    # One way round, every step puts a whole shard (alone) or two (shared) on some x link;
    # both ways round halve that.
    assert alone.bidirectional and shared.bidirectional and shared.max_hops == 2
    assert alone.transfer == pytest.approx(3 * 0.5 * shard / chip.link_bandwidth)
    assert shared.transfer == pytest.approx(3 * 1.0 * shard / chip.link_bandwidth)
    # A line gains nothing from running both ways: it stays one-way.
    line = ring_cost(topo, [_row(topo, 0)], shard)
    assert not line.bidirectional
    assert line.transfer == pytest.approx(3 * shard / chip.link_bandwidth)


def test_all_to_all_is_about_a_quarter_of_all_gather_on_a_ring():
    topo = synthetic_topology("v5e:16x16")
    rings = [_row(topo, y) for y in range(16)]
    buffer = 16 * MB  # per-device buffer of the all-to-all == shard gathered by the AG
    a2a = all_to_all_cost(topo, rings, buffer)
    ag = ring_cost(topo, rings, buffer)
    assert 0.2 < a2a.transfer / ag.transfer < 0.3


def test_contention_when_routes_share_links():
    topo = synthetic_topology("v5e:4x4")
    a, b, c, d = _row(topo, 0)
    alone = permute_cost(topo, [(b, c)], MB)
    shared = permute_cost(topo, [(a, d), (b, c)], MB)  # both cross link b->c
    assert shared.max_link_bytes == 2 * MB
    assert shared.transfer == pytest.approx(2 * alone.transfer)
    disjoint = permute_cost(topo, [(a, b), (d, c)], MB)
    assert disjoint.transfer == pytest.approx(alone.transfer)
    loads, hops = link_loads(topo, [(a, d, 1.0), (d, a, 1.0)])
    assert hops == 3 and loads.sum() == 6 and loads.max() == 1


def test_half_way_messages_split_between_directions():
    topo = synthetic_topology("v5e:16x16")
    src, dst = topo.index((0, 0)), topo.index((8, 0))
    loads, hops = link_loads(topo, [(src, dst, 2.0)])
    assert hops == 8 and loads.max() == 1.0 and loads.sum() == 16.0


def _collective(kind, groups=(), pairs=(), result=MB, operand=0):
    return Collective(
        kind=kind,
        name=kind,
        computation="main",
        result_bytes=result,
        operand_bytes=operand,
        dtype="bf16",
        groups=groups,
        pairs=pairs,
    )


def test_collective_cost_maps_logical_ids_through_the_placement():
    topo = synthetic_topology("v5e:2x2")
    ag = _collective("all-gather", groups=((0, 1, 2, 3),), result=4 * MB)
    cycle = [0, 1, 3, 2]  # logical ring 0-1-2-3 on a physical cycle
    diagonal = [0, 3, 1, 2]  # logical neighbours 0-1 and 2-3 sit diagonally
    good = collective_cost(ag, topo, cycle)
    bad = collective_cost(ag, topo, diagonal)
    assert good.bidirectional and not bad.bidirectional
    assert good.time < bad.time
    # ring="best" recovers the cycle for any order of a full box.
    assert collective_cost(ag, topo, diagonal, ring="best").time == pytest.approx(good.time)
    ar = _collective("all-reduce", groups=((0, 1, 2, 3),), result=4 * MB)
    assert collective_cost(ar, topo, cycle).time == pytest.approx(2 * good.time)
    rs = _collective("reduce-scatter", groups=((0, 1, 2, 3),), result=MB, operand=4 * MB)
    assert collective_cost(rs, topo, cycle).time == pytest.approx(good.time)
    single = _collective("all-reduce", groups=((0,), (1,), (2,), (3,)))
    assert collective_cost(single, topo, cycle).time == 0.0
    with pytest.raises(ValueError, match="permutation"):
        collective_cost(ag, topo, [0, 0, 1, 2])
    with pytest.raises(ValueError, match="ring"):
        collective_cost(ag, topo, cycle, ring="fastest")


@pytest.mark.parametrize("shape", [(2, 2), (2, 4), (4, 2), (4, 4), (3, 4), (4, 3), (2, 3), (8, 4)])
def test_grid_cycle_is_a_closed_unit_hop_tour(shape):
    cycle = grid_cycle(shape)
    assert sorted(cycle) == [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    steps = [
        np.abs(np.subtract(a, b)).sum() for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)
    ]
    assert steps == [1] * len(cycle)


def test_grid_cycle_matches_jax_tray_order_and_rejects_odd_grids():
    # jax/_src/mesh_utils.py `_TRAY_4x4_RING_ORDER`, chips numbered x + 4y.
    tray = (0, 1, 2, 3, 7, 6, 5, 9, 10, 11, 15, 14, 13, 12, 8, 4)
    assert tuple(r * 4 + c for r, c in grid_cycle((4, 4))) == tray
    assert grid_cycle((3, 3)) is None and grid_cycle((1, 4)) is None
