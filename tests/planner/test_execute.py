"""Plans run: a searched plan and hand-made plans of every sequence mode, on 8 CPU devices and
across two processes, give the single-device output."""

import dataclasses
import functools
import math
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from tests.planner._tiny import TINY_WORKLOAD_ARGS

from vidax.models import get
from vidax.planner import ShardingPlan, Workload, load_plan, realize_plan
from vidax.sharding.rules import param_shardings, use_mesh

WORKER = Path(__file__).with_name("multihost_worker.py")
WORKLOAD = Workload(**TINY_WORKLOAD_ARGS)


def _inputs():
    rng = np.random.default_rng(0)
    config = get("tiny").config
    return {
        "x": rng.standard_normal((2, *WORKLOAD.latent_shape)).astype(np.float32),
        "t": np.array([900.0, 100.0], np.float32),
        "ctx": rng.standard_normal((2, config.text_len, config.text_dim)).astype(np.float32),
    }


@functools.cache
def _reference():
    """The single-device output for `_inputs()`."""
    model = get("tiny").build(seed=0)
    return np.asarray(jax.jit(lambda m, *a: m(*a))(model, *_inputs().values()))


def _sharded(mesh, strategy, inputs):
    model = get("tiny").build(seed=0)
    with use_mesh(mesh, strategy) as mesh:
        state = nnx.state(model)
        state = jax.device_put(state, param_shardings(state, mesh, strategy))
        sharded = nnx.merge(nnx.graphdef(model), state)
        compiled = jax.jit(lambda m, *a: m(*a)).lower(sharded, *inputs.values()).compile()
        out = compiled(sharded, *inputs.values())
    return np.asarray(out), compiled.as_text()


def _plan(strategy: str, axis_names, mesh_shape) -> ShardingPlan:
    n = math.prod(mesh_shape)
    return ShardingPlan(
        model="tiny",
        workload=dataclasses.asdict(WORKLOAD),
        topology="v5e:2x4",
        strategy=strategy,
        axis_names=axis_names,
        mesh_shape=mesh_shape,
        placement="hand-made",
        chips=tuple(range(n)),
        coords=tuple((i % 2, i // 2) for i in range(n)),
        estimate={},
    )


# With the searched plan (sp-gather on this workload) and the two-process test (sp-ring+tp),
# these cover every sequence mode, tensor parallelism and sharded weights.
HAND_MADE = [
    ("sp-ring", ("data", "seq", "tensor"), (1, 8, 1), "collective-permute"),  # padded tokens
    ("sp-ulysses+tp+fsdp", ("fsdp", "seq", "tensor"), (2, 2, 2), "all-to-all"),
]


@pytest.mark.parametrize(("strategy", "axes", "shape", "collective"), HAND_MADE)
def test_every_sequence_mode_equals_single_device(tmp_path, strategy, axes, shape, collective):
    assert WORKLOAD.tokens % 8 and WORKLOAD.tokens % 4  # every sequence split pads
    path = _plan(strategy, axes, shape).save(tmp_path / "plan.json")
    mesh, loaded = load_plan(path)
    assert loaded.name == strategy and mesh.axis_names == axes and mesh.devices.shape == shape
    # Not the planned slice (CPU devices): the logical mesh over devices in id order.
    assert [d.id for d in mesh.devices.ravel()] == [d.id for d in jax.devices()[:8]]
    inputs = _inputs()
    got, text = _sharded(mesh, loaded, inputs)
    np.testing.assert_allclose(got, _reference(), atol=1e-5, rtol=1e-5)
    assert collective in text  # the strategy really partitions the way it says


@pytest.mark.tpu_aot
def test_searched_plan_runs_on_8_cpu_devices(tmp_path, tiny_search):
    result = tiny_search
    assert result.best.score.total == min(r.score.total for r in result.rows)
    best = result.best_plan()
    assert math.prod(best.mesh_shape) == 8 and best.topology == "v5e:2x4"
    mesh, strategy = load_plan(best.save(tmp_path / "plan.json"))
    assert strategy.name == best.strategy == result.best.candidate.strategy.name
    inputs = _inputs()
    got, _ = _sharded(mesh, strategy, inputs)
    np.testing.assert_allclose(got, _reference(), atol=1e-5, rtol=1e-5)


def test_load_plan_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_plan(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_plan(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text('{"version": 0}')
    with pytest.raises(ValueError, match="expected version 1"):
        load_plan(tmp_path / "old.json")
    with pytest.raises(ValueError, match="needs a mesh of 16 devices"):
        realize_plan(_plan("sp-ring", ("data", "seq", "tensor"), (2, 8, 1)))
    with pytest.raises(ValueError, match="unknown sharding strategy"):
        realize_plan(_plan("sp-spiral", ("data", "seq", "tensor"), (2, 4, 1)))
    with pytest.raises(ValueError, match="permutation"):
        dataclasses.replace(_plan("sp-ring", ("data", "seq", "tensor"), (2, 4, 1)), chips=(0,) * 8)


def test_plan_maps_by_coordinates_on_the_planned_slice(tpu_topology):
    topo = tpu_topology("v5e:2x4")
    chips = (5, 2, 7, 0, 1, 6, 3, 4)
    p = dataclasses.replace(
        _plan("sp-ring", ("data", "seq", "tensor"), (2, 4, 1)),
        chips=chips,
        coords=tuple(tuple(int(c) for c in topo.coords[i]) for i in chips),
    )
    # Shuffled device list: the coordinates, not the order, decide.
    devices = list(topo.devices)[::-1]
    mesh, _ = realize_plan(p, devices)
    assert [d.id for d in mesh.devices.ravel()] == [topo.devices[i].id for i in chips]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_plan_runs_across_two_processes(tmp_path):
    """2 processes x 4 CPU devices (gloo collectives) run the ring plan like one device."""
    path = _plan("sp-ring+tp", ("data", "seq", "tensor"), (1, 4, 2)).save(tmp_path / "plan.json")
    inputs = _inputs()
    np.savez(tmp_path / "inputs.npz", **inputs)
    out = tmp_path / "out.npy"
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(port),
                str(i),
                str(path),
                str(tmp_path / "inputs.npz"),
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    np.testing.assert_allclose(np.load(out), _reference(), atol=1e-5, rtol=1e-5)
