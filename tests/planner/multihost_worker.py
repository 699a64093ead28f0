"""One process of the two-process plan test (run by test_execute.py, not collected by pytest).

    python multihost_worker.py PORT PROCESS_ID PLAN_JSON INPUTS_NPZ OUT_NPY

Joins a 2-process jax.distributed job on 127.0.0.1:PORT with 4 CPU devices per process (CPU
collectives go through gloo, jax's default CPU collectives implementation), builds the tiny Wan
model from seed 0, realises the plan's mesh over the 8 global devices, runs one forward and
(process 0) saves the gathered output.
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_cpu_collectives_implementation", "gloo")


def main(port: str, process_id: str, plan_path: str, inputs_path: str, out_path: str) -> None:
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=int(process_id),
        initialization_timeout=60,
    )
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from vidax.models import get
    from vidax.planner import load_plan
    from vidax.sharding.rules import param_shardings, use_mesh

    assert jax.process_count() == 2 and len(jax.devices()) == 8, jax.devices()
    mesh, strategy = load_plan(plan_path)
    # Same seed in both processes: identical host copies of every parameter.
    with jax.default_device(jax.local_devices()[0]):
        model = get("tiny").build(seed=0)
    graphdef, state = nnx.split(model)
    state = jax.tree.map(np.asarray, state)  # host copies, identical in both processes
    inputs = np.load(inputs_path)
    with use_mesh(mesh, strategy) as mesh:
        # device_put of identical host values onto a mesh spanning both processes: each
        # process fills its own devices' shards.
        state = jax.device_put(state, param_shardings(state, mesh, strategy))
        batch = tuple(a for a in ("data", "fsdp") if a in mesh.shape and mesh.shape[a] > 1)
        batched = NamedSharding(mesh, P(batch or None))
        args = [jax.device_put(inputs[k], batched) for k in ("x", "t", "ctx")]
        run = jax.jit(
            lambda s, x, t, c: nnx.merge(graphdef, s)(x, t, c),
            out_shardings=NamedSharding(mesh, P()),
        )
        out = run(state, *args)
    full = np.asarray(out.addressable_data(0))
    if jax.process_index() == 0:
        np.save(out_path, full)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
