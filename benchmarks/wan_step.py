"""One Wan denoising step (CFG batch 2): vidax (jit) vs diffusers (torch), side by side.

Both run the same weights (a random diffusers checkpoint loaded into vidax through the real
key map) in float32 on the CPU with the same thread count, each in a fresh subprocess so peak
RSS is attributable. Prints per-step times, the vidax/diffusers ratio and peak RSS.

    python benchmarks/wan_step.py --layers 4 --frames 17 --size 128
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def _config(args):
    return dict(
        patch_size=(1, 2, 2),
        num_attention_heads=12,
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=8960,
        num_layers=args.layers,
        cross_attn_norm=True,
        eps=1e-6,
    )


def _inputs(args):
    rng = np.random.default_rng(0)
    t = 1 + (args.frames - 1) // 4
    s = args.size // 8
    x = rng.standard_normal((2, t, s, s, 16)).astype(np.float32)
    ctx = rng.standard_normal((2, 512, 4096)).astype(np.float32)
    return x, np.array([700.0, 700.0], np.float32), ctx


def _make_checkpoint(args, path):
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    WanTransformer3DModel(**_config(args)).save_pretrained(path, safe_serialization=True)


def _run_vidax(args, path):
    import jax

    from vidax.models.wan import WanConfig, load

    c = _config(args)
    config = WanConfig(
        dim=c["num_attention_heads"] * c["attention_head_dim"],
        num_layers=args.layers,
        num_heads=c["num_attention_heads"],
        ffn_dim=c["ffn_dim"],
        dtype="float32",
        param_dtype="float32",
    )
    model = load(path, config)
    x, t, ctx = (jax.device_put(a) for a in _inputs(args))
    step = jax.jit(lambda m, x, t, c: m(x, t, c))
    out = step(model, x, t, ctx).block_until_ready()  # compile
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step(model, x, t, ctx).block_until_ready()
        times.append(time.perf_counter() - start)
    return times, np.asarray(out)


def _run_diffusers(args, path):
    import torch
    from diffusers import WanTransformer3DModel

    torch.set_num_threads(os.cpu_count())
    from safetensors.torch import load_file

    model = WanTransformer3DModel(**_config(args)).eval()
    model.load_state_dict(load_file(os.path.join(path, "diffusion_pytorch_model.safetensors")))
    x, t, ctx = (torch.from_numpy(a) for a in _inputs(args))
    x = x.permute(0, 4, 1, 2, 3).contiguous()
    with torch.inference_mode():
        out = model(x, t, ctx, return_dict=False)[0]  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            model(x, t, ctx, return_dict=False)
            times.append(time.perf_counter() - start)
    return times, out.permute(0, 2, 3, 4, 1).numpy()


def _child(args):
    run = _run_vidax if args.child == "vidax" else _run_diffusers
    times, out = run(args, args.checkpoint)
    np.save(os.path.join(args.checkpoint, f"out_{args.child}.npy"), out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"times": times, "peak_rss": peak}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", choices=["vidax", "diffusers"])
    parser.add_argument("--checkpoint")
    args = parser.parse_args()
    if args.child:
        return _child(args)

    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        _make_checkpoint(args, tmp)
        results = {}
        for name in ("vidax", "diffusers"):
            cmd = [
                sys.executable,
                __file__,
                "--child",
                name,
                "--checkpoint",
                tmp,
                "--layers",
                str(args.layers),
                "--frames",
                str(args.frames),
                "--size",
                str(args.size),
                "--repeats",
                str(args.repeats),
            ]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if proc.returncode:
                sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        ours, ref = (np.load(os.path.join(tmp, f"out_{n}.npy")) for n in ("vidax", "diffusers"))
    err = float(np.abs(ours - ref).max() / np.abs(ref).max())
    tokens = (1 + (args.frames - 1) // 4) * (args.size // 16) ** 2
    print(
        f"Wan step, dim 1536 x {args.layers} layers, CFG batch 2, {tokens} tokens/video, "
        f"float32, {os.cpu_count()} threads"
    )
    for name, r in results.items():
        print(
            f"  {name:10s} median {statistics.median(r['times']) * 1e3:8.1f} ms   "
            f"min {min(r['times']) * 1e3:8.1f} ms   peak RSS {r['peak_rss'] / 2**30:5.2f} GiB"
        )
    ratio = statistics.median(results["vidax"]["times"]) / statistics.median(
        results["diffusers"]["times"]
    )
    rss = results["vidax"]["peak_rss"] / results["diffusers"]["peak_rss"]
    print(f"vidax/diffusers step time ratio: {ratio:.3f} (speed-up {1 / ratio:.2f}x)")
    print(f"vidax/diffusers peak RSS ratio: {rss:.3f}")
    print(f"max relative output difference: {err:.2e}")


if __name__ == "__main__":
    main()
