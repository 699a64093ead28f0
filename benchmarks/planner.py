"""AoiZora planner benchmark: the planner's choice against two baselines, per case.

For Wan 2.1 1.3B and 14B, 81 frames at 480p (480x832) and 720p (720x1280), on v5e 2x2, 2x4,
4x4, 4x8 and v6e 4x4 (compile-only TPU devices through libtpu; no TPU needed), it compares

  (a) the planner's choice: best (logical candidate, physical placement) of the 3-stage search;
  (b) logical-only search: the best of the same compiled candidates when every mesh takes jax's
      default device order (`mesh_utils.create_device_mesh`), i.e. the search without stage 3;
  (c) a fixed MaxDiffusion-style default (`base_wan_14b.yml`: every chip on one axis that splits
      the sequence and shards the weights, k/v gathered for flash attention, CFG batch not
      split), with jax's default placement,

all priced by the same cost model (compiled HLO: per-op roofline compute + link-contention
communication not hidden by async windows). It prints per case the ratios (b)/(a) and (c)/(a)
(also with rings in the best unit-hop cycle order, `ring="best"`, in case XLA's TPU ring
reordering already repairs jax's order), the ratio (c)/(a) by XLA's own TPU cost analysis
(`compiled.cost_analysis()`: FLOPs and HBM bytes of the per-device program; placement-blind,
and it counts a scanned layer once, so it compares compute only), the number of candidates
compiled against the exhaustive count, and the planner's wall time.

    python benchmarks/planner.py                       # all 20 cases (25-50 min on 2 shared cores)
    python benchmarks/planner.py --models wan2.1-1.3b --sizes 480p --topologies v5e:2x4
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

SIZES = {"480p": (480, 832), "720p": (720, 1280)}
TOPOLOGIES = ("v5e:2x2", "v5e:2x4", "v5e:4x4", "v5e:4x8", "v6e:4x4")
MODELS = ("wan2.1-1.3b", "wan2.1-14b")


def maxdiffusion_candidate(num_devices: int):
    from vidax.planner import ShardingCandidate

    return ShardingCandidate(batch=1, seq=num_devices, tensor=1, sequence="gather", weights="fsdp")


def xla_time(compiled, chip) -> float:
    """XLA's cost analysis as a roofline: max(FLOPs / peak, bytes / HBM bandwidth)."""
    cost = compiled.cost_analysis
    return max(
        cost.get("flops", 0.0) / chip.peak_flops,
        cost.get("bytes accessed", 0.0) / chip.hbm_bandwidth,
    )


def run_case(model: str, size: str, topology: str, cache_dir=None) -> dict:
    from vidax.planner import Workload, estimate_candidate, load_topology, plan
    from vidax.planner.search import compile_candidate, rank_compiled

    height, width = SIZES[size]
    workload = Workload(model=model, frames=81, height=height, width=width)
    topo = load_topology(topology)
    row = {"model": model, "size": size, "topology": topology}
    try:
        result = plan(
            workload, topo, cache_dir=cache_dir, log=lambda m: print("   ", m, flush=True)
        )
    except ValueError as e:
        row["error"] = str(e)
        return row
    best, logical = result.best, result.logical_only()
    row.update(
        a=best.score.total,
        a_name=f"{best.candidate.name} {best.placement.name}",
        a_comm=best.score.communication / best.score.total,
        a_comm_s=best.score.communication,
        b=logical.default.total,
        b_comm=logical.default.communication,
        b_name=logical.candidate.name,
        compiled=len(result.compiled),
        exhaustive=len(result.candidates),
        stage1=len(result.stage1.survivors),
        planner_s=result.timings["total"],
        cached=sum(c.cached for c in result.compiled),
        mem=best.compiled.memory,
    )
    # The same comparison with rings priced in their best unit-hop cycle order.
    best_ring = []
    for c in result.compiled:
        ranked, default = rank_compiled(c, topo, ring="best")
        best_ring.append((ranked[0].total, default.total))
    row["a_best_ring"] = min(a for a, _ in best_ring)
    row["b_best_ring"] = min(b for _, b in best_ring)

    md = maxdiffusion_candidate(topo.num_devices)
    compiled_md = next((c for c in result.compiled if c.candidate == md), None)
    t = time.perf_counter()
    if compiled_md is None:
        try:
            est = estimate_candidate(workload, md, topo.devices, topo.chip)
            compiled_md = compile_candidate(workload, md, topo, est, cache_dir=cache_dir)
        except ValueError as e:
            row["c_error"] = str(e).split(":")[0][:60]
    row["c_compile_s"] = time.perf_counter() - t
    if compiled_md is not None:
        _, default = rank_compiled(compiled_md, topo)
        row["c"] = default.total
        row["c_best_ring"] = rank_compiled(compiled_md, topo, ring="best")[1].total
        row["xla_c_over_a"] = xla_time(compiled_md, topo.chip) / xla_time(best.compiled, topo.chip)
    return row


def fmt(row: dict) -> str:
    case = f"{row['model']:<12} {row['size']:<5} {row['topology']:<8}"
    if "error" in row:
        return f"{case} planner error: {row['error'][:150]}"
    c = row.get("c")
    c_ratio = f"{c / row['a']:6.2f}" if c else f"{'n/a':>6}"
    c_best = f"{row['c_best_ring'] / row['a_best_ring']:6.2f}" if c else f"{'n/a':>6}"
    xla = f"{row['xla_c_over_a']:6.2f}" if c else f"{'n/a':>6}"
    return (
        f"{case} {row['a'] * 1e3:8.1f} {100 * row['a_comm']:5.1f} {row['b'] / row['a']:6.2f} "
        f"{row['b_comm'] / max(row['a_comm_s'], 1e-12):6.2f} "
        f"{c_ratio} {row['b_best_ring'] / row['a_best_ring']:6.2f} {c_best} {xla} "
        f"{row['compiled']:>3}/{row['exhaustive']:<3} {row['planner_s']:7.1f}"
        f"{'*' if row['cached'] else ' '}"
        f"{row['mem'] / 2**30:6.2f}  {row['a_name'][:60]}"
        + (f"  [c: {row['c_error']}]" if "c_error" in row else "")
    )


HEADER = (
    f"{'model':<12} {'size':<5} {'slice':<8} {'(a) ms':>8} {'comm%':>5} {'(b)/a':>6} {'comm':>6} "
    f"{'(c)/a':>6} {'b/a*':>6} {'c/a*':>6} {'xla c/a':>6} {'compiled':>7} {'plan s':>8} "
    f"{'GiB':>6}  planner's choice"
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--topologies", nargs="+", default=list(TOPOLOGIES))
    parser.add_argument(
        "--cache-dir", default=None, help="reuse compiled candidates (planner times then drop)"
    )
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    rows = []
    for model in args.models:
        for size in args.sizes:
            for topology in args.topologies:
                print(f"== {model} {size} {topology}", flush=True)
                rows.append(run_case(model, size, topology, args.cache_dir))
                print(HEADER + "\n" + fmt(rows[-1]), flush=True)

    print("\nAoiZora planner benchmark (times: modelled step latency of one CFG denoising step)")
    print("comm: (b)'s exposed communication over (a)'s (what placement changes; compute does not)")
    print("b/a*, c/a*: the same ratios with rings priced in their best unit-hop cycle order")
    print("plan s: planner wall time (* = some compiled candidates came from the cache)")
    print(f"load average at end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(HEADER)
    for row in rows:
        print(fmt(row))
    ok = [r for r in rows if "error" not in r]
    if ok:
        b_ratios = [r["b"] / r["a"] for r in ok]
        frac = max(r["compiled"] / r["exhaustive"] for r in ok)
        print(
            f"\n(b)/(a): max {max(b_ratios):.2f}, min {min(b_ratios):.2f} over {len(ok)} cases; "
            f"compiled/exhaustive at most {frac:.2f}; planner wall time at most "
            f"{max(r['planner_s'] for r in ok):.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
