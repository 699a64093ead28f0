"""Mesh factorisations, sequence padding and HBM-fit errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vidax.planner import (
    CHIPS,
    check_fits,
    compile_checked,
    device_memory,
    mesh_shapes,
    padded_length,
)


def test_mesh_shapes_enumerates_ordered_factorisations():
    shapes = mesh_shapes(8, ("data", "seq"))
    assert [tuple(s.values()) for s in shapes] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    three = mesh_shapes(16, ("data", "seq", "tensor"))
    assert len(three) == 15  # ordered factorisations of 2^4 into 3 parts: C(6, 2)
    assert all(s["data"] * s["seq"] * s["tensor"] == 16 for s in three)
    # Wan 14B's 40 heads: Ulysses degree must divide them, so 16 is out.
    wan = mesh_shapes(16, ("data", "seq"), allowed={"seq": lambda u: 40 % u == 0})
    assert [s["seq"] for s in wan] == [8, 4, 2, 1]


def test_mesh_shapes_bad_input_raises():
    with pytest.raises(ValueError, match="no mesh of 16 chips"):
        mesh_shapes(16, ("seq",), allowed={"seq": lambda u: 12 % u == 0})
    with pytest.raises(ValueError, match="unknown axes"):
        mesh_shapes(4, ("data",), allowed={"tensor": lambda t: True})
    with pytest.raises(ValueError, match=">= 1"):
        mesh_shapes(0, ("data",))


def test_padded_length():
    assert padded_length(75600, 16) == (75600, 0.0)
    padded, waste = padded_length(32760, 16)
    assert padded == 32768 and waste == pytest.approx(8 / 32768)
    with pytest.raises(ValueError):
        padded_length(0, 4)


@pytest.mark.tpu_aot
def test_hbm_errors_carry_numbers(tpu_topology):
    topo = tpu_topology("v5e:2x2")
    mesh = Mesh(np.array(topo.devices).reshape(4), ("data",))
    x = jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    compiled = jax.jit(lambda x: x * 2).lower(x).compile()
    need = check_fits(compiled, topo.chip)
    assert need == device_memory(compiled) >= 2 * 1024 * 4096 * 4  # input + output shards
    tiny = dataclasses.replace(CHIPS["v5e"], hbm_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"needs 0\.\d\d GiB per device but v5e has 0\.00 GiB"):
        check_fits(compiled, tiny)
    # 30 copies of a 4 GiB array cannot fit one v5e chip: XLA's OOM becomes a ValueError.
    big = jax.ShapeDtypeStruct((1024, 1 << 20), jnp.float32, sharding=NamedSharding(mesh, P()))
    lowered = jax.jit(lambda x: jnp.stack([x * i for i in range(30)])).lower(big)
    with pytest.raises(
        ValueError,
        match=r"v5e HBM \(15\.75 GiB usable per chip\): needs [\d.]+G of temporaries, 15\.75G avail",
    ):
        compile_checked(lowered, topo.chip)
