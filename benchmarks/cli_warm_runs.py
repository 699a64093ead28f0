"""`vidax generate` end to end, as a user runs it twice: full sampling vs `--accel` options.

Each configuration runs as its own `vidax generate` process (interpreter start-up, imports,
weight loading, compilation or the persistent compile cache, sampling, decoding, mp4 writing),
in a fresh compile-cache directory: the first run compiles and fills the cache, the second is
what a returning user waits for. Prints the wall times and the second runs' ratios to full.

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
    p.add_argument("--repeats", type=int, default=2, help="warm runs per configuration")
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
        times: dict[str, list[float]] = {}
        for name, extra in configs.items():
            out = ["--out", str(Path(tmp) / f"{name}.mp4")]
            times[name] = [_run([*base, *extra, *out], env) for _ in range(1 + args.repeats)]
            print(
                f"{name:10s} first {times[name][0]:6.1f} s, warm "
                + ", ".join(f"{t:.1f}" for t in times[name][1:])
                + " s",
                flush=True,
            )
    warm = {k: min(v[1:]) for k, v in times.items()}
    print(f"\nwarm wall time (best of {args.repeats}), ratio to full:")
    for name, seconds in warm.items():
        print(f"  {name:10s} {seconds:6.1f} s  {warm['full'] / seconds:5.2f}x")


if __name__ == "__main__":
    main()
