"""DVG side by side: full sampling vs DVG vs fixed spatial / temporal / joint reduction vs fewer
steps at equal compute, on the shipped tiny model over the fixed eval prompts, in one process.

For every method and prompt (same starting noise): the latents are decoded and scored with the
`vidax.metrics` suite, with PSNR/SSIM against the full-sampling video. Wall-clock is measured
on compiled programs (a first pass compiles every schedule; the timed pass runs the methods
interleaved per prompt). FLOPs are counted from each compiled forward's HLO
(`vidax.planner.hlo.analyze_hlo`, exact through the scanned blocks) per stage shape, times the
steps spent there. Then the FLOP-count speed-up of the selector's schedules for wan2.1-1.3b
(81 frames 480p) and hunyuanvideo (129 frames 720p) at their native step counts, also from the
compiled step's HLO (abstract weights, full depth).

    python benchmarks/dvg.py                       # everything
    python benchmarks/dvg.py --prompts 8 --no-large  # 8 prompts spread over the categories
    python benchmarks/dvg.py --random 16 --no-large  # 16 fresh draws (+ the oracle row, always)
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import time
import warnings

# FLOPs are counted on CPU-compiled HLO whichever device runs the videos (a TPU's compiled HLO
# counts the same plans differently), so the CPU backend is always on.
os.environ["JAX_PLATFORMS"] = ",".join(
    dict.fromkeys([*os.environ.get("JAX_PLATFORMS", "cpu").split(","), "cpu"])
)

import imageio.v3 as iio
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax import dvg, metrics, pipeline
from vidax.data import EVAL_PROMPTS, random_eval_prompts
from vidax.eval.harness import TABLE_METRICS, video_grid
from vidax.models.registry import get, get_vae
from vidax.planner.hlo import analyze_hlo
from vidax.sampling import step_cache
from vidax.text import embed_prompts

FIXED = ("spatial", "temporal", "joint")
# Metrics where the full output is the reference: compared as "within 3% of full".
SUITE = (*TABLE_METRICS, "trajectory_error")


# -- FLOPs from compiled HLO ----------------------------------------------------------------------


def _abstract_inputs(spec, latent, batch):
    c = spec.config
    channels = c.in_channels
    x = jax.ShapeDtypeStruct((batch, *latent, channels), jnp.dtype(c.dtype))
    t = jax.ShapeDtypeStruct((batch,), jnp.float32)
    if spec.family == "wan":
        cond = {"context": jax.ShapeDtypeStruct((batch, c.text_len, c.text_dim), jnp.float32)}
    else:
        cond = {
            "text": jax.ShapeDtypeStruct((batch, c.text_len, c.text_dim), jnp.float32),
            "text_mask": jax.ShapeDtypeStruct((batch, c.text_len), jnp.bool_),
        }
        if hasattr(c, "pooled_dim"):
            cond["pooled"] = jax.ShapeDtypeStruct((batch, c.pooled_dim), jnp.float32)
        if getattr(c, "guidance_embeds", False):
            cond["guidance"] = jax.ShapeDtypeStruct((batch,), jnp.float32)
    return x, t, cond


@functools.cache
def hlo_step_flops(spec_name: str, latent: tuple[int, int, int], batch: int) -> float:
    """FLOPs of one compiled forward on a (t, h, w) latent (abstract weights, full depth).

    The attention implementation is pinned to "xla": its dots are the same as the chunked
    path's, which `auto` picks at long sequences.
    """
    spec = get(spec_name).with_config(attention_impl="xla")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: spec.build()))
    x, t, cond = _abstract_inputs(spec, latent, batch)

    def forward(state, x, t, cond):
        return nnx.merge(graphdef, state)(x, t, **cond)

    with jax.default_device(jax.devices("cpu")[0]):
        compiled = jax.jit(forward).lower(state, x, t, cond).compile()
    return analyze_hlo(compiled.as_text()).flops


def plan_flops(spec_name: str, p: dvg.Plan, batch: int, skip=None) -> float:
    """FLOPs of a plan's model evaluations (padded stage shapes) from compiled HLO; with `skip`
    (base steps reusing the previous forward, `vidax.sampling.step_cache`), the forwards the
    step cache runs: a stage's first step and a reduced stage's last step always compute."""
    total = 0.0
    for i, s in enumerate(p.stages):
        n = s.stop - s.start
        skipped = 0
        if skip is not None:
            last = n - 1 if i < len(p.stages) - 1 else n  # a reduced stage's last step computes
            skipped = sum(skip[s.start + j] for j in range(1, last))
        total += (n - skipped) * hlo_step_flops(spec_name, s.padded, batch)
    return total


# -- the tiny-model comparison --------------------------------------------------------------------


def _load(spec, args):
    """The DiT and VAE: --transformer / --vae safetensors files, else the shipped weights."""
    transformer = spec.loader(args.transformer, spec.config) if args.transformer else spec.load()
    if args.vae:
        vae_spec = get_vae(spec.vae)
        vae = vae_spec.loader(args.vae, vae_spec.config)
    else:
        vae = spec.load_vae()
    return transformer, vae


def _unit(frames: np.ndarray) -> np.ndarray:
    """(F, H, W, 3) in [0, 1] -> [-1, 1] for `vidax.metrics`."""
    return frames * 2.0 - 1.0


def run_tiny(args) -> None:
    spec = get(args.model)
    d = spec.defaults
    frames = args.frames or d.num_frames
    height, width = args.height or d.height, args.width or d.width
    steps, shift = args.steps or d.steps, args.shift or d.shift
    guidance = d.guidance if args.guidance is None else args.guidance
    latent = spec.geometry().latent_shape(frames, height, width)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        transformer, vae = _load(spec, args)
    random_weights = [str(w.message) for w in caught if "random" in str(w.message)]
    family = pipeline.Adapter.of(spec)
    solver = d.solver(sampler=args.sampler, steps=steps, shift=shift)
    few_steps = max(1, round(steps * args.budget))
    few_solver = d.solver(sampler=args.sampler, steps=few_steps, shift=shift)
    cfg_batch = 1 if family.embedded_guidance else 2
    # dvg runs under the preset's policy (as `pipeline.generate` does) unless --space says
    # otherwise; the fixed families as asked
    space = {"preset": spec.dvg_spatial, "on": True, "off": False}[args.space]
    dvg_policy = dvg.Policy(spatial=space, factors=args.factors)
    if args.random:
        prompts = list(random_eval_prompts(args.random, args.seed))
        prompt_set = f"{len(prompts)} random draws from seed {args.seed}"
    else:
        prompts = _spread(EVAL_PROMPTS, args.prompts)
        prompt_set = f"{len(prompts)} eval prompts"
    source = ", ".join(f"{k} {v}" for k, v in (("DiT", args.transformer), ("VAE", args.vae)) if v)
    source = source or "shipped weights"
    if random_weights:
        source = "RANDOM weights: " + "; ".join(random_weights)
    print(
        f"model {spec.name} ({source})\n"
        f"video {frames}x{height}x{width} -> latent {latent[:3]}, patch {spec.config.patch_size}, "
        f"{solver.__class__.__name__} {steps} steps shift {shift}, guidance {guidance}, "
        f"budget {args.budget:.3g} (token-steps), {prompt_set}; "
        f"DVG may reduce space: {'yes' if space else 'no'} (--space {args.space}), "
        f"by factors {', '.join(map(str, args.factors))}\n"
        f"device: {jax.devices()[0].platform} ({jax.devices()[0].device_kind}; JAX_PLATFORMS "
        "picks another, cpu by default); FLOPs counted on CPU-compiled HLO"
    )

    def conditioning(prompt):
        text = embed_prompts(spec, [prompt.caption])
        neg = embed_prompts(spec, [""])
        cond = family.conditioning(text, guidance)
        negative = None if family.embedded_guidance else family.conditioning(neg, guidance)
        return cond, negative

    cfg = 1.0 if family.embedded_guidance else guidance
    budgets = {m: args.budget for m in ("dvg", *FIXED)}
    # A fixed family that cannot reach the budget on this latent runs at its cheapest schedule.
    for m in FIXED:
        if not dvg.candidates(
            latent[:3], spec.config.patch_size, steps, args.budget, families=(m,)
        ):
            cheapest = min(
                c.cost
                for c in dvg.candidates(
                    latent[:3], spec.config.patch_size, steps, 1.0, families=(m,)
                )
            )
            budgets[m] = cheapest
            print(f"note: {m} cannot reach budget {args.budget:.3g} here; runs at {cheapest:.3g}")

    def method(name, noise, cond, negative):
        if name == "full":
            out = pipeline.denoise(transformer, noise, cond, negative, solver=solver, guidance=cfg)
            return out, None
        if name == "fewer-steps":
            out = pipeline.denoise(
                transformer, noise, cond, negative, solver=few_solver, guidance=cfg
            )
            return out, None
        out, choices = dvg.accelerate(
            transformer,
            noise,
            cond,
            negative,
            solver=solver,
            guidance=cfg,
            accel=name,
            budget=budgets[name],
            policy=dvg_policy if name == "dvg" else None,
        )
        return out, choices[0]

    names = ["full", "dvg", *FIXED, "fewer-steps"]
    results = {n: [] for n in names}
    choices = {n: [] for n in names}
    latents_out = {n: [] for n in names}
    times = {n: [] for n in names}
    inputs = []
    for prompt in prompts:
        noise = jax.random.normal(jax.random.key(prompt.seed), (1, *latent), jnp.float32)
        inputs.append((noise, *conditioning(prompt)))
    started = time.perf_counter()

    def progress(phase: str, i: int) -> None:
        # stderr, one line per video: a run cut off by a timeout still shows how far it got
        print(
            f"[{time.perf_counter() - started:7.1f}s] {phase} {i + 1}/{len(inputs)}",
            file=sys.stderr,
            flush=True,
        )

    # Pass 1: outputs (compiles every program once).
    for i, (noise, cond, negative) in enumerate(inputs):
        for n in names:
            out, choice = method(n, noise, cond, negative)
            latents_out[n].append(np.asarray(out))
            choices[n].append(choice)
        progress("sampled (first pass, compiling)", i)
    # Pass 2: timed, methods interleaved per prompt.
    for _ in range(args.repeats):
        for i, (noise, cond, negative) in enumerate(inputs):
            for n in names:
                start = time.perf_counter()
                out, _ = method(n, noise, cond, negative)
                jax.block_until_ready(out)
                times[n].append(time.perf_counter() - start)
            progress("timed", i)
    # Decode and score.
    sheet_rows = []
    for i, prompt in enumerate(prompts):
        decoded = {
            n: np.asarray(pipeline.decode(vae, jnp.asarray(latents_out[n][i]))[0]) for n in names
        }
        videos = {n: _unit(v) for n, v in decoded.items()}
        for n in names:
            ref = None if n == "full" else videos["full"]
            results[n].append(metrics.evaluate(videos[n], prompt.spec, reference=ref))
            if ref is not None:
                results[n][-1]["latent_psnr"] = _latent_psnr(
                    latents_out[n][i], latents_out["full"][i]
                )
        if args.sheet:
            labels = {
                n: f"{n} {results[n][-1]['psnr']:.1f} dB, adh {results[n][-1]['caption_adherence']:.2f}"
                for n in names
                if n != "full"  # the reference: no PSNR
            }
            labels["full"] = f"full, adh {results['full'][-1]['caption_adherence']:.2f}"
            sheet_rows.append(
                (f"{prompt.name}: {prompt.caption}", [(labels[n], decoded[n]) for n in names])
            )
        progress("decoded and scored", i)
    if args.sheet:
        iio.imwrite(args.sheet, video_grid(sheet_rows, frames=args.sheet_frames, scale=1))
        print(f"contact sheet (rows: videos; columns: {', '.join(names)}): {args.sheet}")

    full_flops = steps * hlo_step_flops(args.model, latent[:3], cfg_batch)
    summary = {n: metrics.summarise(results[n]) for n in names}
    print()
    header = (
        f"{'method':<12} {'wall x':>7} {'FLOP x':>7} {'tok-steps':>9} {'PSNR dB':>8} "
        f"{'SSIM':>6} {'latPSNR':>8} {'worst metric vs full':>26}"
    )
    print(header)
    print("-" * len(header))
    flop_speedups = {}
    wall = {n: sum(times[n]) for n in names}
    for n in names:
        if n == "full":
            flops = [full_flops] * len(prompts)
            costs = [1.0] * len(prompts)
        elif n == "fewer-steps":
            flops = [few_steps * hlo_step_flops(args.model, latent[:3], cfg_batch)] * len(prompts)
            costs = [few_steps / steps] * len(prompts)
        else:
            flops, costs = [], []
            for c in choices[n]:
                p = dvg.plan(c.schedule, latent[:3], spec.config.patch_size, solver)
                f = plan_flops(args.model, p, cfg_batch)
                if n == "dvg" and c.signals is not None:  # the probe ran (a settled choice
                    # spends none); its steps are reused when the schedule starts with them
                    probe = dvg.probe_stage(latent[:3], spec.config.patch_size, steps, dvg_policy)
                    if probe is not None and c.schedule.stages[0] != probe:
                        pp = dvg.plan(
                            dvg.Schedule.of([probe, (1, 1, steps - probe.steps)]),
                            latent[:3],
                            spec.config.patch_size,
                            solver,
                        )
                        f += probe.steps * hlo_step_flops(
                            args.model, pp.stages[0].padded, cfg_batch
                        )
                flops.append(f)
                costs.append(c.cost)
        flop_speedups[n] = full_flops * len(prompts) / sum(flops)
        s = summary[n]
        worst = _worst_metric(summary["full"], s)
        psnr = s["psnr"].mean if "psnr" in s else math.inf
        ssim = s["ssim"].mean if "ssim" in s else 1.0
        lat = s["latent_psnr"].mean if "latent_psnr" in s else math.inf
        print(
            f"{n:<12} {wall['full'] / wall[n]:>7.2f} {flop_speedups[n]:>7.2f} "
            f"{statistics.mean(costs):>9.3f} {psnr:>8.2f} {ssim:>6.3f} {lat:>8.2f} {worst:>26}"
        )
    # The oracle: per video, the fixed family whose video came closest to full (PSNR), i.e.
    # what a selector that knew the answer would pick among them.
    best = [max(FIXED, key=lambda m, i=i: results[m][i]["psnr"]) for i in range(len(prompts))]
    summary["oracle"] = metrics.summarise([results[m][i] for i, m in enumerate(best)])
    o = summary["oracle"]
    oracle_cost = statistics.mean(choices[m][i].cost for i, m in enumerate(best))
    print(
        f"{'oracle':<12} {'-':>7} {'-':>7} {oracle_cost:>9.3f} {o['psnr'].mean:>8.2f} "
        f"{o['ssim'].mean:>6.3f} {o['latent_psnr'].mean:>8.2f} "
        f"{_worst_metric(summary['full'], o):>26}"
    )
    print()
    columns = [*names, "oracle"]
    print(f"metric means ({' | '.join(columns)}):")
    for k in (*SUITE, "psnr", "ssim", "perceptual_distance"):
        row = [summary[n][k].mean if k in summary[n] else float("nan") for n in columns]
        print(f"  {k:<26}" + " ".join(f"{v:>9.4g}" for v in row))
    print()
    matched = sum(c.family == m for c, m in zip(choices["dvg"], best, strict=True))
    picks = {m: best.count(m) for m in FIXED if best.count(m)}
    print(
        f"oracle (best fixed family per video by PSNR): "
        f"{', '.join(f'{k} x{v}' for k, v in picks.items())}; DVG chose that family for "
        f"{matched} of {len(prompts)} videos"
    )
    families = {}
    for c in choices["dvg"]:
        families[c.family] = families.get(c.family, 0) + 1
    print("DVG choices:", ", ".join(f"{k} x{v}" for k, v in sorted(families.items())))
    for prompt, c, r in zip(prompts, choices["dvg"], results["dvg"], strict=True):
        m, dd = c.signals if c.signals else (float("nan"), float("nan"))
        print(
            f"  {prompt.name:<12} motion {m:.3f} detail {dd:.3f} -> {c.family:<8} "
            f"{c.schedule.describe():<48} PSNR {r['psnr']:.2f}"
        )
    print()
    _targets(summary, wall, flop_speedups)


def _spread(items, k: int) -> list:
    """k items evenly spread over the list (the eval prompts are grouped by motion category)."""
    k = max(1, min(k, len(items)))
    return [items[(i * len(items)) // k] for i in range(k)]


def _latent_psnr(x: np.ndarray, ref: np.ndarray) -> float:
    peak = float(np.max(np.abs(ref)))
    mse = float(np.mean((x - ref) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


def _worst_metric(full, s) -> str:
    worst, name = 0.0, "-"
    for k in SUITE:
        if k not in full or k not in s or not math.isfinite(full[k].mean):
            continue
        rel = abs(s[k].mean - full[k].mean) / max(abs(full[k].mean), 1e-8)
        if rel >= worst:
            worst, name = rel, k
    return f"{name} {100 * worst:+.1f}%"


def _targets(summary, wall, flop_speedups) -> None:
    dvg_s = summary["dvg"]
    speed = wall["full"] / wall["dvg"]
    psnr = dvg_s["psnr"].mean
    within = all(
        abs(dvg_s[k].mean - summary["full"][k].mean) <= 0.03 * abs(summary["full"][k].mean)
        for k in SUITE
        if k in dvg_s and math.isfinite(summary["full"][k].mean)
    )
    print("targets (tiny model):")
    print(f"  wall-clock speed-up >= 3x:          {speed:.2f}x  {'PASS' if speed >= 3 else 'FAIL'}")
    print(f"  mean PSNR vs full >= 30 dB:         {psnr:.2f}  {'PASS' if psnr >= 30 else 'FAIL'}")
    print(f"  every metric within 3% of full:     {'PASS' if within else 'FAIL'}")
    for m in FIXED:
        better = (
            dvg_s["psnr"].mean > summary[m]["psnr"].mean
            and dvg_s["ssim"].mean > summary[m]["ssim"].mean
        )
        print(
            f"  DVG better than {m:<9} (PSNR/SSIM): {dvg_s['psnr'].mean:.2f}/{dvg_s['ssim'].mean:.3f} vs "
            f"{summary[m]['psnr'].mean:.2f}/{summary[m]['ssim'].mean:.3f} at "
            f"{wall['full'] / wall[m]:.2f}x wall  {'PASS' if better else 'FAIL'}"
        )


# -- calibration of the selector's weights ---------------------------------------------------------


def run_calibration(args) -> None:
    """Fits the selector's motion/detail weight ratio on training-distribution clips (never the
    eval prompts): for each ratio, the schedules it picks per clip, their PSNR vs full."""
    from vidax.data import caption, sample_spec

    spec = get(args.model)
    d = spec.defaults
    frames = args.frames or d.num_frames
    height, width = args.height or d.height, args.width or d.width
    steps, shift = args.steps or d.steps, args.shift or d.shift
    guidance = d.guidance if args.guidance is None else args.guidance
    latent = spec.geometry().latent_shape(frames, height, width)
    transformer, vae = _load(spec, args)
    family = pipeline.Adapter.of(spec)
    solver = d.solver(sampler=args.sampler, steps=steps, shift=shift)
    patch = tuple(spec.config.patch_size)
    cfg = 1.0 if family.embedded_guidance else guidance
    first = dvg.probe_stage(latent[:3], patch, steps)
    probe_plan = dvg.plan(
        dvg.Schedule.of([first, (1, 1, steps - first.steps)]), latent[:3], patch, solver
    )
    ratios = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
    rows = []
    for i in range(args.calibrate):
        clip = sample_spec(50_000 + i)
        text = embed_prompts(spec, [caption(clip)])
        neg = embed_prompts(spec, [""])
        cond = family.conditioning(text, guidance)
        negative = None if family.embedded_guidance else family.conditioning(neg, guidance)
        noise = jax.random.normal(jax.random.key(50_000 + i), (1, *latent), jnp.float32)
        full = pipeline.denoise(transformer, noise, cond, negative, solver=solver, guidance=cfg)
        ref = _unit(pipeline.decode(vae, full)[0])
        probed = dvg.probe(transformer, noise, cond, negative, plan=probe_plan, guidance=cfg)
        m, dd = (float(v) for v in np.asarray(probed.signals)[0])
        picks = {}
        for r in ratios:
            policy = dvg.Policy(motion_weight=r, detail_weight=1.0)
            c = dvg.select(
                latent[:3],
                patch,
                solver.sigmas,
                args.budget,
                (m, dd),
                policy=policy,
                probe=first,
            )
            picks[r] = c.schedule
        for fam in FIXED:
            c = dvg.select(latent[:3], patch, solver.sigmas, args.budget, None, families=(fam,))
            if c is not None:
                picks[fam] = c.schedule
        scores = {}
        for schedule in set(picks.values()):
            p = dvg.plan(schedule, latent[:3], patch, solver)
            out = dvg.denoise(transformer, noise, cond, negative, plan=p, guidance=cfg)
            scores[schedule] = metrics.psnr(_unit(pipeline.decode(vae, out)[0]), ref)
        rows.append({k: scores[v] for k, v in picks.items()})
        print(
            f"clip {i:>3} motion {m:.3f} detail {dd:.3f}  "
            + " ".join(f"{k}:{scores[v]:.1f}" for k, v in picks.items()),
            flush=True,
        )
    print("\nmean PSNR vs full per motion/detail weight ratio (and fixed families):")
    for k in rows[0]:
        print(f"  {k!s:>8}: {statistics.mean(r[k] for r in rows):.2f} dB")


# -- large presets --------------------------------------------------------------------------------


def run_large(args) -> None:
    print(
        f"\nFLOP-count speed-up at native resolution, budget {args.budget:.3g} token-steps "
        "(compiled step HLO, abstract weights; dvg rows include the probe unless resumed):"
    )
    for name in ("wan2.1-1.3b", "hunyuanvideo"):
        spec = get(name)
        d = spec.defaults
        latent = spec.geometry().latent_shape(d.num_frames, d.height, d.width)[:3]
        patch = tuple(spec.config.patch_size)
        solver = d.solver()
        batch = 1 if pipeline.Adapter.of(spec).embedded_guidance else 2
        full = d.steps * hlo_step_flops(name, latent, batch)
        print(
            f"  {name}: {d.num_frames} frames {d.height}x{d.width} -> latent {latent}, "
            f"{d.steps} steps, {full:.3g} FLOPs full"
        )
        rows = {}
        for family in FIXED:
            found = dvg.candidates(latent, patch, d.steps, args.budget, families=(family,))
            if found:
                rows[family] = dvg.choose(found, None, latent, solver.sigmas)
        probe = dvg.probe_stage(latent, patch, d.steps)
        found = dvg.candidates(latent, patch, d.steps, args.budget, probe=probe)
        for m in (0.0, 0.5, 1.0):
            for dd in (0.0, 0.5, 1.0):
                rows[f"dvg m={m:.1f} d={dd:.1f}"] = dvg.choose(
                    found, (m, dd), latent, solver.sigmas
                )
        probe_flops = 0.0
        if probe is not None:
            pp = dvg.plan(
                dvg.Schedule.of([probe, (1, 1, d.steps - probe.steps)]), latent, patch, solver
            )
            probe_flops = probe.steps * hlo_step_flops(name, pp.stages[0].padded, batch)
            print(
                f"    probe {probe} on {pp.stages[0].shape}: {probe_flops / full:.4f} of the FLOPs"
            )
        seen = set()
        skip = step_cache.uniform_skips(d.steps)
        computed = d.steps - sum(skip)
        print(
            f"    cache: keep {step_cache.DEFAULT_KEEP:g} -> {computed} of {d.steps} forwards "
            f"(skip rate {sum(skip) / d.steps:.2f}: a calibration where every step changes "
            "alike, so the cache's rules alone place the skips)"
        )
        print(
            f"    {'cache':<20} {'':<52} forwards {computed / d.steps:.3f}  "
            f"FLOPs {d.steps / computed:5.2f}x"
        )
        for label, c in rows.items():
            p = dvg.plan(c.schedule, latent, patch, solver)
            flops = plan_flops(name, p, batch)
            cached = plan_flops(name, p, batch, skip=skip)
            if label.startswith("dvg") and c.schedule.stages[0] != probe:
                flops += probe_flops  # the probe ran and was not resumed
                cached += probe_flops
            speedup = full / flops
            key = (c.schedule, label.startswith("dvg"))
            note = "" if key not in seen else " (same)"
            seen.add(key)
            print(
                f"    {label:<20} {c.schedule.describe():<52} tok-steps {c.cost:.3f}  "
                f"FLOPs {speedup:5.2f}x {'PASS' if speedup >= 5 else 'FAIL'}; +cache "
                f"{full / cached:5.2f}x{note}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=len(EVAL_PROMPTS))
    parser.add_argument(
        "--random", type=int, default=0, help="score N fresh draws instead of the eval prompts"
    )
    parser.add_argument("--seed", type=int, default=7, help="first seed of the --random draws")
    parser.add_argument("--budget", type=float, default=dvg.DEFAULT_BUDGET)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--shift", type=float, default=None)
    parser.add_argument("--guidance", type=float, default=None)
    parser.add_argument("--sampler", default=None)
    parser.add_argument("--frames", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--space",
        choices=("preset", "on", "off"),
        default="preset",
        help="may DVG's selector reduce space (preset: the model's dvg_spatial); the dvg row "
        "only: the fixed families run as named, --calibrate fits the default policy",
    )
    parser.add_argument(
        "--factors",
        type=lambda v: tuple(int(f) for f in v.split(",")),
        default=dvg.Policy.factors,
        help="reduction factors DVG's selector may use, e.g. 2 or 2,4 (default: the policy's, "
        f"{','.join(map(str, dvg.Policy.factors))}); the dvg row only",
    )
    parser.add_argument(
        "--sheet",
        default=None,
        help="write a contact sheet (PNG): a row per video, its methods side by side",
    )
    parser.add_argument("--sheet-frames", type=int, default=5, help="frames per video on the sheet")
    parser.add_argument("--transformer", default=None, help="DiT safetensors (default: shipped)")
    parser.add_argument("--vae", default=None, help="VAE safetensors (default: shipped)")
    parser.add_argument("--no-tiny", action="store_true")
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument(
        "--calibrate", type=int, default=0, help="fit the selector on N training-style clips"
    )
    args = parser.parse_args()
    if args.calibrate:
        run_calibration(args)
        return
    if not args.no_tiny:
        run_tiny(args)
    if not args.no_large:
        run_large(args)


if __name__ == "__main__":
    main()
