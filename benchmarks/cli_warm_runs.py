"""`vidax generate` end to end, as a user runs it twice: full sampling vs `--accel` options.

Each configuration runs as its own `vidax generate` process (interpreter start-up, imports,
weight loading, compilation or the persistent compile cache, sampling, decoding, mp4 writing),
in a fresh compile-cache directory: the first run compiles and fills the cache, the later
ones (alternating between the configurations) are what a returning user waits for. Prints the
wall times and the warm runs' median ratios to full.

    python benchmarks/cli_warm_runs.py --accel dvg --budget 0.5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _run(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vidax", "generate", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"vidax generate {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--prompt", default="a green circle bouncing slowly to the right")
    p.add_argument("--accel", default="dvg", help="comma-separated --accel values to compare")
    p.add_argument("--budget", default=None, help="--budget of the accelerated runs")
    p.add_argument("--repeats", type=int, default=5, help="warm runs per configuration")
    args = p.parse_args()
    configs = {"full": []}
    for accel in args.accel.split(","):
        extra = ["--accel", accel]
        if args.budget is not None:
            extra += ["--budget", args.budget]
        configs[accel] = extra
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "VIDAX_CACHE_DIR": str(Path(tmp) / "jax")}
        env["VIDAX_STEP_CACHE_DIR"] = str(Path(tmp) / "step_cache")
        base = ["--model", args.model, "--prompt", args.prompt]

        def run(name: str) -> float:
            out = ["--out", str(Path(tmp) / f"{name}.mp4")]
            return _run([*base, *configs[name], *out], env)

        first = {name: run(name) for name in configs}
        # The warm runs alternate between the configurations, so a slow spell of a shared
        # machine falls on all of them alike.
        warm: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name in configs:
                warm[name].append(run(name))
    for name in configs:
        print(
            f"{name:10s} first {first[name]:6.1f} s, warm "
            + ", ".join(f"{t:.1f}" for t in warm[name])
            + " s",
            flush=True,
        )
    median = {k: float(np.median(v)) for k, v in warm.items()}
    print(f"\nwarm wall time (median of {args.repeats}, alternated), ratio to full:")
    for name, seconds in median.items():
        faster = sum(f > t for f, t in zip(warm["full"], warm[name], strict=True))
        print(
            f"  {name:10s} {seconds:6.1f} s  {median['full'] / seconds:5.2f}x"
            + (
                f"  (faster than full in {faster} of {args.repeats} pairs)"
                if name != "full"
                else ""
            )
        )


if __name__ == "__main__":
    main()
