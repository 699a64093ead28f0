"""Load check of `vidax serve`: N concurrent jobs over real HTTP, all must complete in order.

Starts the app under uvicorn on 127.0.0.1 (a free port, in this process), then for each round
submits `--jobs` videos at once from as many client threads, alternating the tiny model and the
causal tiny-causal (each at its preset's default size unless told otherwise), and follows each
job's server-sent events. Prints per job: time from POST to its first causal chunk on the
client, to `done`, and the server's queued / total seconds; then checks that every job
completed, none was lost, and each model's jobs ran one at a time in submission order. Round 1
includes loading and compiling each model (cold); later rounds are warm.

    JAX_PLATFORMS=cpu python benchmarks/serve_load.py [--jobs 8 --rounds 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import httpx
import uvicorn

from vidax.serve import create_app


def _start(app) -> tuple[uvicorn.Server, threading.Thread, str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return server, thread, f"http://{host}:{port}"


def _job(url: str, body: dict) -> dict:
    """POSTs one video and follows its events; client-side times from the POST."""
    with httpx.Client(base_url=url, timeout=600) as client:
        start = time.monotonic()
        response = client.post("/v1/videos", json=body)
        response.raise_for_status()
        job_id = response.json()["id"]
        first_chunk = None
        with client.stream("GET", f"/v1/videos/{job_id}/events") as events:
            for line in events.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                if event["type"] == "chunk" and first_chunk is None:
                    first_chunk = time.monotonic() - start
                if event["type"] in ("done", "failed"):
                    break
        done = time.monotonic() - start
        video = client.get(f"/v1/videos/{job_id}").json()
    return {"id": job_id, "first_chunk": first_chunk, "done": done, "video": video}


def _round(url: str, bodies: list[dict]) -> list[dict]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: _job(url, body), bodies))


def _check(results: list[dict]) -> list[str]:
    """Problems: jobs not done, lost, or overlapping within a model."""
    problems = [
        f"{r['id']}: {r['video']['status']} {r['video']['error']}"
        for r in results
        if r["video"]["status"] != "done"
    ]
    if len({r["id"] for r in results}) != len(results):
        problems.append("duplicate ids")
    videos = sorted((r["video"] for r in results), key=lambda v: int(v["id"][1:]))
    for model in {v["settings"]["model"] for v in videos}:
        mine = [v for v in videos if v["settings"]["model"] == model]
        for before, after in itertools.pairwise(mine):
            if after["started"] < before["finished"]:
                problems.append(f"{after['id']} started before {before['id']} finished")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="concurrent jobs per round")
    parser.add_argument("--rounds", type=int, default=2, help="round 1 is cold (compiles)")
    parser.add_argument("--tiny-frames", type=int, default=None)
    parser.add_argument("--tiny-steps", type=int, default=None)
    parser.add_argument("--causal-frames", type=int, default=None)
    args = parser.parse_args()

    app = create_app(max_queue=max(16, args.jobs))
    server, thread, url = _start(app)
    tiny = {"model": "tiny", "frames": args.tiny_frames, "steps": args.tiny_steps}
    causal = {"model": "tiny-causal", "frames": args.causal_frames}
    failed = False
    try:
        for r in range(1, args.rounds + 1):
            bodies = [
                {
                    "prompt": f"a red circle bouncing, video {i}",
                    "seed": i,
                    **{k: v for k, v in (tiny if i % 2 == 0 else causal).items() if v is not None},
                }
                for i in range(args.jobs)
            ]
            start = time.monotonic()
            results = _round(url, bodies)
            wall = time.monotonic() - start
            results.sort(key=lambda x: int(x["id"][1:]))
            print(f"\nround {r} ({'cold: loads and compiles' if r == 1 else 'warm'}), {url}")
            print(
                f"{'job':>4} {'model':<12} {'settings':<16} {'first chunk s':>13} "
                f"{'done s':>7} {'queued s':>8} {'run s':>6}"
            )
            for res in results:
                v = res["video"]
                s, t = v["settings"], v["timings"]
                size = f"{s['frames']}x{s['height']}x{s['width']}" + (
                    f" {s['steps']}st" if s["steps"] else ""
                )
                chunk = "-" if res["first_chunk"] is None else f"{res['first_chunk']:.2f}"
                print(
                    f"{v['id']:>4} {s['model']:<12} {size:<16} {chunk:>13} {res['done']:>7.2f} "
                    f"{t.get('queued_seconds', 0):>8.2f} {t.get('total_seconds', 0):>6.2f}"
                )
            streamed = [x for x in results if x["first_chunk"] is not None]
            chunks = [x["first_chunk"] for x in streamed]
            server_chunks = ", ".join(
                f"{x['video']['timings']['first_chunk_seconds']:.2f}" for x in streamed
            )
            problems = _check(results)
            done = sum(x["video"]["status"] == "done" for x in results)
            print(
                f"{done}/{len(results)} completed, in order per model: "
                f"{'yes' if not problems else 'NO'}; wall {wall:.2f}s; time to first causal chunk "
                f"from POST: min {min(chunks):.2f}s, median {statistics.median(chunks):.2f}s, "
                f"max {max(chunks):.2f}s (server, from each job's start: {server_chunks} s)"
            )
            for p in problems:
                print("  problem:", p)
            failed |= bool(problems)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
