"""Topology strings, wrap-around rules, compile-only devices and dimension-order routing."""

import numpy as np
import pytest

from vidax.planner import CHIPS, get_chip, parse_topology, synthetic_topology
from vidax.planner.topology import Topology


@pytest.mark.parametrize(
    ("name", "gen", "dims"),
    [
        ("v5e:4x4", "v5e", (4, 4)),
        ("v5e:2x4", "v5e", (2, 4)),
        ("v6e:16x16", "v6e", (16, 16)),
        ("v5p:2x2x4", "v5p", (2, 2, 4)),
        ("v4:4x4x8", "v4", (4, 4, 8)),
        ("V5litepod-2x2", "v5e", (2, 2)),
    ],
)
def test_parse_topology(name, gen, dims):
    chip, parsed = parse_topology(name)
    assert chip.name == gen
    assert parsed == dims


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("v5e:3x3", "no 3x3 slice"),
        ("v5e:4x4x4", "no 4x4x4 slice"),
        ("v5p:4x4", "no 4x4 slice"),
        ("v5p:4x6x8", "multiples of 4"),
        ("v9x:4x4", "unknown TPU generation"),
        ("v5e", "bad topology string"),
        ("4x4", "bad topology string"),
        ("v5e:4by4", "bad topology string"),
    ],
)
def test_bad_topology_strings_raise(name, message):
    with pytest.raises(ValueError, match=message):
        parse_topology(name)


def test_chip_constants_are_consistent():
    for chip in CHIPS.values():
        assert chip.hbm_bytes < 100 * 2**30
        assert chip.bidirectional_link_bandwidth == 2 * chip.link_bandwidth
        assert chip.ici_ports == 2 * chip.ndim
    # Ordering facts the model relies on (sources in hardware.py).
    assert CHIPS["v6e"].link_bandwidth == 2 * CHIPS["v5e"].link_bandwidth
    assert CHIPS["v5e"].hbm_bytes == int(15.75 * 2**30)
    with pytest.raises(ValueError, match="unknown TPU generation"):
        get_chip("v7")


@pytest.mark.parametrize(
    ("name", "wrap"),
    [
        ("v5e:4x4", (False, False)),
        ("v5e:4x8", (False, False)),
        ("v5e:8x16", (False, True)),
        ("v5e:16x16", (True, True)),
        ("v5p:2x2x4", (False, False, False)),
        ("v5p:4x4x4", (True, True, True)),
        ("v4:4x4x8", (True, True, True)),
    ],
)
def test_wrap_around_rules(name, wrap):
    assert synthetic_topology(name).wrap == wrap


def test_links_and_neighbours():
    mesh = synthetic_topology("v5e:4x4")
    torus = synthetic_topology("v5e:16x16")
    # Without wrap-around a 4x4 has 2*(3*4)*2 = 48 directed links; corners have 2 neighbours.
    assert len(mesh.links) == 48
    degree = np.bincount([src for _, src, _ in mesh.links], minlength=16)
    assert degree[mesh.index((0, 0))] == 2 and degree[mesh.index((1, 1))] == 4
    assert len(torus.links) == 256 * 4
    for link, src, dst in mesh.links[:10]:
        assert mesh.link_endpoints(link) == (src, dst)
        assert mesh.hops(src, dst) == 1


def test_routing_is_dimension_ordered_and_shortest_on_wrapped_axes():
    mesh = synthetic_topology("v5e:4x4")
    a, b = mesh.index((0, 0)), mesh.index((3, 2))
    path = mesh.route(a, b)
    assert len(path) == mesh.hops(a, b) == 5
    # x first: the first three links leave chips on row y=0.
    chips = [mesh.link_endpoints(link)[0] for link in path]
    assert [tuple(mesh.coords[c]) for c in chips[:3]] == [(0, 0), (1, 0), (2, 0)]
    torus = synthetic_topology("v5e:16x16")
    a, b = torus.index((0, 0)), torus.index((15, 14))
    assert torus.hops(a, b) == 1 + 2  # around the wrap on both axes
    assert len(torus.route(b, a)) == 3
    assert torus.hops(torus.index((0, 0)), torus.index((8, 0))) == 8


def test_topology_rejects_bad_devices():
    chip, dims = parse_topology("v5e:2x2")
    devices = synthetic_topology("v5e:2x2").devices
    with pytest.raises(ValueError, match="4 chips but 3 devices"):
        Topology(chip, dims, devices[:3])
    with pytest.raises(ValueError, match="share coords"):
        Topology(chip, dims, [devices[0], devices[0], devices[1], devices[2]])


@pytest.mark.tpu_aot
@pytest.mark.parametrize(
    "name", ["v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:4x8", "v6e:4x4", "v5p:2x2x4"]
)
def test_compile_only_devices_match_synthetic_layout(tpu_topology, name):
    topo = tpu_topology(name)
    assert not topo.synthetic
    assert len(topo.devices) == topo.num_devices
    assert topo.devices[0].device_kind == topo.chip.device_kind
    for i, d in enumerate(topo.devices):
        assert tuple(d.coords[: topo.ndim]) == tuple(topo.coords[i])
    if topo.chip.name in ("v5e", "v6e"):
        # Compile-only v5e/v6e number chips x-fastest, like the planner.
        assert [d.id for d in topo.devices] == list(range(topo.num_devices))
