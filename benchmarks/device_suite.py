"""vidax vs diffusers on one accelerator, section by section, in one prepared run.

    python benchmarks/device_suite.py                       # every section -> runs/device_suite
    python benchmarks/device_suite.py --sections ceilings,wan-step --out /tmp/suite
    python benchmarks/device_suite.py --smoke               # toy sizes on the CPU, < 2 minutes
    python benchmarks/device_suite.py --list

A section is a function `fn(ctx) -> dict` registered with `@section(name, cap_s=...)`; sections
run in registration order. After every section (and whenever one side of a comparison finishes)
`results.json` and `table.md` are rewritten in `--out`; the table is printed last.

Each section has a time cap. It plans its work to fit (fewer repeats, denoising steps or layers)
and records what it scaled down under "scaled". A supervisor process runs the sections in a
worker process and watches the caps: a worker whose section overruns its cap by more than a grace
period is killed, a worker that dies (segfault, OOM kill) is noted, the section records the error
and a new worker runs the remaining sections, so a crash or a hang costs one section, not the run.

Both frameworks run in the same worker, vidax first, on the same device, from the same random
weights: each model is built once (on the host) and saved as a diffusers-layout safetensors
checkpoint under `--work`; vidax loads it through its key map (`vidax.checkpoint`), diffusers
with `load_state_dict`, cast as `from_pretrained(torch_dtype=...)` casts. diffusers is imported
only inside the torch side of a section, so without it the vidax numbers are still measured and
the torch side records why it could not run. docs/gpu.md has the H200 command and how to read
the results.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import gc
import hashlib
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

# Both frameworks share the device: JAX must not take 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's vidax

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax import dvg, pipeline, sampling
from vidax.checkpoint import save_model
from vidax.forcing import CacheLayout, CausalWan, ForcingConfig, KVCache, init_cache
from vidax.forcing.attention import (
    _with_chunk,
    dense_attention,
    make_rope,
    selected_attention,
    selected_backend,
    sparse_attention,
    time_angles,
)
from vidax.forcing.rollout import chunk_velocity, write_clean
from vidax.kernels.pbsa import BlockSizes, pbsa, pbsa_reference, rotate_keys
from vidax.kernels.pbsa.kernel import TPU_MAX_ROWS
from vidax.models import wan, wan_vae
from vidax.models.registry import ModelSpec, get, get_causal
from vidax.nn.attention import _device as attention_device
from vidax.nn.attention import attention, choose_impl
from vidax.text import fit_prompt_embeds

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
DEFAULT_TOTAL_S = 495.0  # the caps below add up to this; 9 minutes with kill grace and pip
MIN_SECTION_S = 10.0  # a section with less time left than this is skipped
SMOKE_MIN_SECTION_S = 1.0
# Denoising settings of Wan 2.1 at 480p (its diffusers scheduler config; the registry's defaults).
STEPS, SHIFT, GUIDANCE = 50, 3.0, 5.0
DVG_BUDGETS = (0.2, 0.33)
# PBSA at Wan 2.1 1.3B 480p (docs/sparse_forcing.md): 1560 tokens a latent frame (30 x 52 after
# the 2x2 patch), 12 heads of 128, a 3-frame chunk of queries over a sink 3 + window 15 frame
# pool of 60-token blocks (26 a frame), one selection per latent frame of queries (tiny-causal's
# `query_tile=None`; runs before 2026-12-07 used tiles of 120).
PBSA_SIZES = {"frame": 1560, "heads": 12, "head_dim": 128, "chunk": 3, "pool_frames": 18}
PBSA_SIZES |= {"block": 60, "block_q": 1560}
# The decode section's sparse cache cuts frames into blocks of 64 (24 full and one of 24
# tokens): a multiple of bf16's 16-row tile, so PBSA copies blocks straight from the cache
# (blocks of 60 are padded to 64, a copy of the cache every forward).
PBSA_SIZES |= {"sparse_block": 64}
SMOKE_PBSA_SIZES = {"frame": 24, "heads": 2, "head_dim": 32, "chunk": 3, "pool_frames": 6}
SMOKE_PBSA_SIZES |= {"block": 12, "block_q": 24, "sparse_block": 8}
PBSA_FRACTIONS = (1.0, 0.5, 0.3, 0.15)  # of the pool's blocks each query tile attends to
# The TPU kernel's keys per inner step (`BlockSizes.block_kv`; the default is 1024) tried at 30%.
PBSA_BLOCK_KV = (128, 512, 2048)
# The decode section's latent frame in the smoke run: 4 x 6 = 24 tokens after the patch
# (SMOKE_PBSA_SIZES' frame; at full size Wan's 480p frame, 30 x 52 = 1560 tokens).
SMOKE_DECODE_LATENT_HW = (8, 12)
# Toy models for --smoke: the same code paths at sizes a CPU runs in seconds.
SMOKE_CONFIGS = {
    "wan2.1-1.3b": wan.WanConfig(
        dim=64, num_layers=2, num_heads=4, ffn_dim=128, text_dim=32, text_len=16, freq_dim=32
    ),
    "wan2.1-14b": wan.WanConfig(
        dim=96, num_layers=3, num_heads=6, ffn_dim=192, text_dim=48, text_len=16, freq_dim=32
    ),
}
SMOKE_VIDEOS = {"wan2.1-1.3b": (33, 128, 128), "wan2.1-14b": (17, 128, 128)}
SMOKE_VAE_LATENT = (3, 8, 8)  # 9 frames of 64x64 through the `tiny` VAE preset


# -- the section registry -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Section:
    """A registered section.

    Attributes:
      name: the name `--sections` takes.
      run: `run(ctx) -> dict` of results (more may be recorded on the way with `ctx.record`).
      cap_s: its time cap on the device (the smoke run caps it too, far above its needs).
      headline: result keys that must hold numbers after a successful run (the smoke test checks
        them).
      row: results -> (vidax, diffusers, vidax/diffusers, notes) cells of the short table.
    """

    name: str
    run: Callable[[Context], dict]
    cap_s: float
    headline: tuple[str, ...]
    row: Callable[[dict], tuple[str, str, str, str]]


SECTIONS: dict[str, Section] = {}


def section(name: str, *, cap_s: float, headline: tuple[str, ...] = (), row=None):
    """Registers `fn(ctx) -> dict` as the section `name` (run in registration order)."""

    def register(fn):
        SECTIONS[name] = Section(name, fn, cap_s, headline, row or _default_row)
        return fn

    return register


@dataclasses.dataclass(frozen=True)
class Side:
    """One framework's half of a comparison: result fields and its output (for the diff)."""

    fields: dict
    output: np.ndarray | None = None


@dataclasses.dataclass
class Context:
    """What a section sees: its sizes, its time, earlier results, and where to record."""

    name: str
    smoke: bool
    deadline: float  # time.time() by which the section should be done
    work: Path
    report: Report

    def left(self) -> float:
        """Seconds left to this section's cap."""
        return self.deadline - time.time()

    def prior(self, name: str) -> dict:
        """Results of an earlier section ({} if it did not run)."""
        return self.report.sections.get(name, {}).get("results", {})

    @property
    def results(self) -> dict:
        """This section's results so far."""
        return self.prior(self.name)

    def record(self, **values) -> None:
        """Adds results now (kept even if the section fails or is killed later)."""
        self.report.record(self.name, values)

    def scaled(self, note: str) -> None:
        """Says what the section scaled down to fit its cap (or the smoke run)."""
        print(f"   [{self.name}] scaled: {note}", flush=True)
        self.report.note(self.name, note)

    def side(self, label: str, fn: Callable[..., Side], *args, **kwargs) -> Side | None:
        """Runs one side of a comparison; records its fields, or its error (then returns None)."""
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # the other side still runs
            if isinstance(e, ImportError):  # a machine without the reference (a TPU host)
                print(f"   [{self.name}] {label} not run: {e}", flush=True)
            else:
                traceback.print_exc()
            self.report.error(self.name, label, e)
            return None
        finally:
            _release()
        self.record(**result.fields)
        return result


# -- the results files ----------------------------------------------------------------------------


class Report:
    """results.json + table.md in `out`, rewritten atomically on every change."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out / "results.json"
        self.data = json.loads(self.path.read_text())

    @classmethod
    def fresh(cls, out: Path, names: list[str], args) -> Report:
        """A new results.json: every section pending, the run's settings under "suite"."""
        out.mkdir(parents=True, exist_ok=True)
        caps = _caps(args.cap)
        meta = {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "smoke": args.smoke,
            "total_seconds": args.total_seconds,
            "argv": sys.argv[1:],
        }
        sections = {
            n: {"status": "pending", "cap_s": caps[n], "headline": list(SECTIONS[n].headline)}
            for n in names
        }
        _write_json(out / "results.json", {"suite": meta, "sections": sections})
        report = cls(out)
        report.write()
        return report

    @property
    def sections(self) -> dict:
        return self.data["sections"]

    def reload(self) -> None:
        with contextlib.suppress(OSError, json.JSONDecodeError):  # keep the last on a bad read
            self.data = json.loads(self.path.read_text())

    def status(self, name: str) -> str:
        return self.sections[name]["status"]

    def update(self, name: str, **fields) -> None:
        self.sections[name].update(fields)
        self.write()

    def record(self, name: str, values: dict) -> None:
        self.sections[name].setdefault("results", {}).update(_plain(values))
        self.write()

    def note(self, name: str, note: str) -> None:
        self.sections[name].setdefault("scaled", []).append(note)
        self.write()

    def error(self, name: str, where: str, e: BaseException | str) -> None:
        message = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
        message = message if len(message) < 2000 else message[:2000] + " ..."
        self.sections[name].setdefault("errors", {})[where] = message
        self.write()

    def write(self) -> None:
        _write_json(self.path, self.data)
        (self.out / "table.md").write_text(table(self.data))


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=True))
    tmp.replace(path)


def _plain(values: dict) -> dict:
    """JSON-ready values: numpy scalars to Python, floats rounded to 4 significant digits."""
    out = {}
    for k, v in values.items():
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float) and math.isfinite(v) and v != 0:
            v = float(f"{v:.4g}")
        out[k] = v
    return out


# -- the short table ------------------------------------------------------------------------------


def table(data: dict) -> str:
    """The short markdown table: one row per section."""
    suite = data["suite"]
    env = suite.get("env", {})
    title = f"device suite: {env.get('device', '?')}, {suite.get('started', '')}"
    if suite.get("smoke"):
        title += " (SMOKE: toy sizes, not a measurement)"
    lines = [
        f"# {title}",
        "",
        "| section | status | vidax | diffusers | vidax/diffusers | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in data["sections"].items():
        status = s["status"] + (f" {s['seconds']:.0f} s" if "seconds" in s else "")
        cells = ("", "", "", "")
        if s.get("results") and name in SECTIONS:
            try:
                cells = SECTIONS[name].row(s["results"])
            except Exception as e:  # a row never hides the results
                cells = ("", "", "", f"(row failed: {e})")
        notes = [cells[3]] if cells[3] else []
        notes += [f"scaled: {n}" for n in s.get("scaled", [])]
        notes += [f"{k} error: {_first_line(v)}" for k, v in s.get("errors", {}).items()]
        if s.get("error"):
            notes.append(s["error"])
        row = [name, status, *cells[:3], "; ".join(notes)]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in row) + " |")
    return "\n".join(lines) + "\n"


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _num(r: dict, key: str, fmt: str = ".3g", unit: str = "") -> str:
    v = r.get(key)
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{fmt}}{unit}"


def _default_row(r: dict) -> tuple[str, str, str, str]:
    return ("", "", "", ", ".join(f"{k} {v}" for k, v in r.items()))


def _memory_cell(r: dict, side: str) -> str:
    """Peak device memory: measured where attributable, else the compiled program's footprint."""
    if r.get(f"{side}_peak_gib") is not None:
        return f"{r[f'{side}_peak_gib']:.1f} GiB"
    if r.get(f"{side}_program_gib") is not None:
        return f"program {r[f'{side}_program_gib']:.2f} GiB"
    return "peak -"


def _step_row(r: dict) -> tuple[str, str, str, str]:
    cells = []
    for side in ("vidax", "diffusers"):
        cells.append(
            f"{_num(r, side + '_ms', '.1f')} ms, MFU {_num(r, side + '_mfu', '.0%')}, "
            f"{_memory_cell(r, side)}"
        )
    notes = (
        f"max rel diff {_num(r, 'max_rel_diff', '.1e')}, {r.get('tokens', '?')} tokens x2, "
        f"attention {r.get('attention', '?')}"
    )
    if r.get("vidax_self_attn_ms") and r.get("vidax_ms"):
        share = (r["vidax_self_attn_ms"] + r.get("vidax_cross_attn_ms", 0.0)) / r["vidax_ms"]
        notes += (
            f"; vidax's attention alone: self {_num(r, 'vidax_self_attn_ms', '.0f')} ms, cross "
            f"{_num(r, 'vidax_cross_attn_ms', '.0f')} ms ({share:.0%} of the step)"
        )
    if "layers" in r:
        notes = (
            f"{r['layers']}/{r['full_layers']} layers; full-depth estimate "
            f"{_num(r, 'vidax_ms_full_est', '.0f')} / {_num(r, 'diffusers_ms_full_est', '.0f')} ms; "
            + notes
        )
    return cells[0], cells[1], _num(r, "ratio", ".2f"), notes


def _vae_row(r: dict) -> tuple[str, str, str, str]:
    cells = [
        f"{_num(r, s + '_ms', '.0f')} ms, {_memory_cell(r, s)}" for s in ("vidax", "diffusers")
    ]
    notes = f"{r.get('frames')} frames, max rel diff {_num(r, 'max_rel_diff', '.1e')}"
    return cells[0], cells[1], _num(r, "ratio", ".2f"), notes


def _generate_row(r: dict) -> tuple[str, str, str, str]:
    cells = [f"{_num(r, s + '_s_full', '.1f')} s" for s in ("vidax", "diffusers")]
    notes = f"{r.get('steps')} steps {r.get('scheduler', '')}"
    if r.get("steps_run") != r.get("steps"):
        notes += f" (ran {r.get('steps_run')}, times scaled)"
    return cells[0], cells[1], _num(r, "ratio", ".2f"), notes


def _dvg_row(r: dict) -> tuple[str, str, str, str]:
    labels = [label for label, _, _ in _dvg_runs(None) if f"{label}_s" in r]
    parts = [
        f"{label}: {_num(r, f'{label}_s', '.1f')} s ({_num(r, f'{label}_speedup', '.2f')}x)"
        for label in labels
    ]
    notes = f"full {_num(r, 'full_s', '.1f')} s ({r.get('full_source', '?')}); " + "; ".join(
        f"{label} {r.get(f'{label}_schedule', '?')}" for label in labels
    )
    if any("+cache" in label for label in labels):
        notes += f"; cache skips {_num(r, 'cache_skip_rate', '.0%')} of the steps (stated plan)"
    return ", ".join(parts), "", "", notes


def _ceilings_row(r: dict) -> tuple[str, str, str, str]:
    return (
        f"bf16 matmul {_num(r, 'matmul_tflops', '.3g')} TFLOP/s, copy "
        f"{_num(r, 'copy_tbps', '.2f')} TB/s",
        "",
        "",
        f"matmul {r.get('matmul_n')}^3, copy {_num(r, 'copy_gib', '.3g')} GiB (read + write)",
    )


def _pbsa_row(r: dict) -> tuple[str, str, str, str]:
    pct = [round(100 * f) for f in PBSA_FRACTIONS]
    kernel = ", ".join(
        f"{p}%: {_num(r, f'kernel_ms_{p}', '.2f')} ms ({_num(r, f'speedup_{p}', '.2f')}x)"
        for p in pct
        if f"kernel_ms_{p}" in r
    )
    rates = ", ".join(
        f"{p}% {_num(r, f'key_rate_{p}', '.2f')}" for p in pct if f"key_rate_{p}" in r
    )
    notes = (
        f"{r.get('backend', '?')} kernel vs dense {r.get('dense_impl', '?')} "
        f"{_num(r, 'dense_ms', '.2f')} ms over {r.get('keys', '?')} keys; per-key rate vs dense: "
        f"{rates}; max rel err vs reference {_num(r, 'max_rel_err', '.1e')} (ragged, GQA), "
        f"{_num(r, 'max_rel_err_rotated', '.1e')} with RoPE on read; 30% with RoPE on read "
        f"{_num(r, 'kernel_rotated_ms_30', '.2f')} ms"
    )
    sweep = [k.removeprefix("kernel_ms_30_") for k in r if k.startswith("kernel_ms_30_")]
    if sweep:
        tried = ", ".join(f"{t} {_num(r, f'kernel_ms_30_{t}', '.2f')} ms" for t in sweep)
        notes += (
            f"; 30% by tiles (default block_kv {BlockSizes().block_kv}, query rows up to "
            f"{TPU_MAX_ROWS}): {tried}"
        )
    return kernel, "", "", notes


def _decode_row(r: dict) -> tuple[str, str, str, str]:
    cells = (
        f"dense {_num(r, 'dense_ms', '.1f')} ms, sparse {_num(r, 'sparse_ms', '.1f')} ms "
        f"({_num(r, 'speedup', '.2f')}x), dense-shared sparse "
        f"{_num(r, 'sparse_shared_ms', '.1f')} ms ({_num(r, 'speedup_shared', '.2f')}x) per chunk "
        "forward"
    )
    notes = (
        f"{r.get('layers', '?')}/{r.get('full_layers', '?')} layers; full-depth estimate "
        f"{_num(r, 'dense_ms_full_est', '.0f')} / {_num(r, 'sparse_ms_full_est', '.0f')} ms; "
        f"selection + compression {_num(r, 'overhead_ms_full_est', '.1f')} ms a forward "
        f"({_num(r, 'overhead_share', '.0%')} of sparse); peak KV "
        f"{_num(r, 'dense_kv_gib', '.2f')} / {_num(r, 'sparse_kv_gib', '.2f')} GiB "
        f"(x{_num(r, 'kv_ratio', '.2f')}); chunk {r.get('chunk_tokens', '?')} tokens over dense "
        f"{r.get('dense_context_tokens', '?')} / sparse {r.get('sparse_selected_tokens', '?')} "
        f"selected + {r.get('sparse_compressed_tokens', '?')} compressed; "
        f"PBSA {r.get('sparse_backend', '?')}; one layer's attention: dense "
        f"{_num(r, 'dense_attn_ms', '.2f')}, sparse {_num(r, 'sparse_attn_ms', '.2f')} "
        f"(selected {_num(r, 'selected_attn_ms', '.2f')} with RoPE on read, of which the "
        f"attention on a built pool {_num(r, 'selected_kernel_ms', '.2f')}; "
        f"{_num(r, 'selected_rotate_first_ms', '.2f')} with the "
        f"pool rotated first, the rotation alone {_num(r, 'rotation_ms', '.2f')}; largest "
        f"difference {_num(r, 'rotate_on_read_max_diff', '.1e')}), dense-shared "
        f"{_num(r, 'shared_sparse_attn_ms', '.2f')} (selected "
        f"{_num(r, 'shared_selected_attn_ms', '.2f')}) ms"
    )
    return cells, "", "", notes


# -- timing, FLOPs and memory ---------------------------------------------------------------------


# Set in a --smoke worker: a smoke run checks the code paths and measures nothing, so every
# timing is one warm-up call and one timed one (the interpreted PBSA kernel takes seconds a call).
SMOKE_TIMING = False


def _repeat(run_once: Callable[[], float], *, warmup: int, lo: int, hi: int, budget_s: float):
    """Runs `warmup` untimed calls, then at least `lo` and at most `hi` timed ones, stopping
    after `lo` once another would exceed `budget_s` of timed work."""
    if SMOKE_TIMING:
        warmup, lo, hi = min(warmup, 1), 1, 1
    for _ in range(warmup):
        run_once()
    times: list[float] = []
    while len(times) < hi:
        if len(times) >= lo and sum(times) + statistics.median(times) > budget_s:
            break
        times.append(run_once())
    return times


def time_jax(fn, *args, warmup=2, lo=10, hi=30, budget_s=math.inf):
    """Host clock around `fn(*args)` until `block_until_ready`; returns (seconds list, output)."""
    out = None

    def once() -> float:
        nonlocal out
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return time.perf_counter() - start

    return _repeat(once, warmup=warmup, lo=lo, hi=hi, budget_s=budget_s), out


def time_torch(fn, device, *, warmup=2, lo=10, hi=30, budget_s=math.inf):
    """CUDA events around `fn()` on a GPU (host clock on the CPU); returns (seconds, output)."""
    import torch

    out = None

    def once() -> float:
        nonlocal out
        if device.type != "cuda":
            start = time.perf_counter()
            out = fn()
            return time.perf_counter() - start
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return _repeat(once, warmup=warmup, lo=lo, hi=hi, budget_s=budget_s), out


def time_first_call(ctx: Context, fn, *, reserve_s: float = 0.0, hi: int = 3):
    """Times `fn()` whose first call compiles (a sampler loop: too long to run twice lightly).

    The first call's wall time minus the compile seconds JAX reports (`CompileClock`) is the
    estimate; up to `hi` more calls, timed, replace it while `ctx.left() - reserve_s` allows.

    Returns:
      (seconds, {"first_call_s", "compile_s", "repeats" (0: the estimate)}, output).
    """
    before = CompileClock.seconds
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    compile_s = CompileClock.seconds - before
    estimate = max(first - compile_s, 1e-6)
    budget = ctx.left() - reserve_s
    times = []
    if budget > 1.2 * estimate:
        times, out = time_jax(fn, warmup=0, lo=1, hi=hi, budget_s=budget)
    elif compile_s > 0:
        ctx.scaled(f"timed as the first call minus its {compile_s:.0f} s of compiling")
    else:  # no compile events (another JAX version?): the estimate includes compiling
        ctx.scaled("timed as the first call, compiling included (JAX reported no compile time)")
    seconds = statistics.median(times) if times else estimate
    return seconds, {"first_call_s": first, "compile_s": compile_s, "repeats": len(times)}, out


def compile_jax(fn, *args, compiler_options=None, donate_argnums=()):
    """`jax.jit(fn)` compiled ahead of time: (executable, compile seconds, program bytes).

    `args` may be arrays or `jax.ShapeDtypeStruct`s. Program bytes are the executable's own
    device footprint (arguments + outputs + temporaries - aliased), known on every backend.
    """
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=donate_argnums).lower(*args).compile(compiler_options)
    seconds = time.perf_counter() - start
    m = compiled.memory_analysis()
    program = None
    if m is not None:
        program = (
            m.argument_size_in_bytes
            + m.output_size_in_bytes
            + m.temp_size_in_bytes
            - m.alias_size_in_bytes
        )
    return compiled, seconds, program


class CompileClock:
    """Seconds JAX has spent tracing, lowering and compiling in this process."""

    seconds = 0.0

    @classmethod
    def listen(cls, event: str, seconds: float, **_) -> None:
        if event.startswith("/jax/core/compile/"):
            cls.seconds += seconds


jax.monitoring.register_event_duration_secs_listener(CompileClock.listen)


def step_flops(config, latent: tuple[int, int, int], batch: int = 2) -> float:
    """Matmul + attention FLOPs of one DiT forward (the analytic count DVG budgets with)."""
    return dvg.step_flops(config, latent, batch=batch)


def timing_fields(side: str, times: list[float], flops: float | None, ctx: Context) -> dict:
    """Median/min ms, repeats, and (given FLOPs) TFLOP/s and MFU against the measured ceiling."""
    median = statistics.median(times)
    fields = {
        f"{side}_ms": 1e3 * median,
        f"{side}_min_ms": 1e3 * min(times),
        f"{side}_repeats": len(times),
    }
    if flops is not None:
        tflops = flops / median / 1e12
        ceiling = ctx.prior("ceilings").get("matmul_tflops")
        fields[f"{side}_tflops"] = tflops
        fields[f"{side}_mfu"] = tflops / ceiling if ceiling else None
    return fields


def jax_peak_bytes() -> int | None:
    """The device's high-water mark of bytes in use since the process started (None on CPU)."""
    stats = jax.devices()[0].memory_stats()
    return stats.get("peak_bytes_in_use") if stats else None


def vidax_memory(before: int | None, program: int | None) -> dict:
    """vidax's peak: the process high-water mark when this section raised it (so it is this
    section's peak), always the compiled program's footprint."""
    after = jax_peak_bytes()
    raised = after is not None and (before is None or after > before)
    return {
        "vidax_peak_gib": after / GIB if raised else None,
        "vidax_process_peak_gib": None if after is None else after / GIB,
        "vidax_program_gib": None if program is None else program / GIB,
    }


def attention_choice(config: wan.WanConfig, tokens: int, batch: int = 2) -> tuple[str, str]:
    """What `attention(impl="auto")` picks for a Wan block's self- and cross-attention here,
    and why: ("self cudnn, cross cudnn", reasons)."""
    platform, capability = attention_device()
    n, k = config.num_heads, config.head_dim
    picks = []
    for label, s in (("self", tokens), ("cross", config.text_len)):
        impl, reason = choose_impl(
            platform,
            (batch, tokens, n, k),
            (batch, s, n, k),
            jnp.dtype(config.dtype),
            False,
            compute_capability=capability,
        )
        picks.append((f"{label} {impl}", f"{label}: {reason}"))
    return ", ".join(p[0] for p in picks), "; ".join(p[1] for p in picks)


def rel_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max |ref|."""
    ours, ref = np.asarray(ours, np.float32), np.asarray(ref, np.float32)
    if ours.shape != ref.shape:
        raise ValueError(f"outputs differ in shape: {ours.shape} vs {ref.shape}")
    return float(np.abs(ours - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def _release() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- torch / diffusers ----------------------------------------------------------------------------


def torch_device(ctx: Context):
    """(torch, device): the GPU where there is one, the CPU in the smoke run."""
    import torch

    if ctx.smoke:
        return torch, torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device: a CPU diffusers run is no comparison")
    return torch, torch.device("cuda")


def diffusers_module():
    try:
        import diffusers
    except ImportError as e:
        raise RuntimeError(
            f"diffusers is not importable ({e}); carry its wheel (docs/gpu.md)"
        ) from e
    return diffusers


def _torch_dtype(torch, name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _load_torch(model, path: Path, dtype, device):
    """Loads a vidax-written checkpoint and casts parameters as `from_pretrained(torch_dtype=)`
    does: `_keep_in_fp32_modules` stay float32, buffers (RoPE tables) keep their dtype."""
    import torch
    from safetensors.torch import load_file

    model.load_state_dict(load_file(path, device=str(device)))
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, p in model.named_parameters():
        target = torch.float32 if any(k in name.split(".") for k in keep) else dtype
        p.data = p.data.to(target)
    return model.eval()


def diffusers_wan(path: Path, config: wan.WanConfig, device):
    """diffusers' `WanTransformer3DModel` with the checkpoint's weights, in the config's dtype."""
    import torch

    diffusers = diffusers_module()
    kwargs = wan.to_diffusers_config(config)
    with torch.device(device):
        model = diffusers.WanTransformer3DModel(**kwargs)
    return _load_torch(model, path, _torch_dtype(torch, config.dtype), device)


def diffusers_vae(path: Path, config: wan_vae.WanVAEConfig, device):
    """diffusers' `AutoencoderKLWan` with the checkpoint's weights."""
    import torch

    diffusers = diffusers_module()
    kwargs = wan_vae.to_diffusers_config(config)
    with torch.device(device):
        model = diffusers.AutoencoderKLWan(**kwargs)
    return _load_torch(model, path, _torch_dtype(torch, config.dtype), device)


def channels_first(torch, x: np.ndarray, device, dtype):
    """(b, t, h, w, c) numpy -> torch (b, c, t, h, w)."""
    return torch.from_numpy(np.ascontiguousarray(x)).permute(0, 4, 1, 2, 3).to(device, dtype)


def channels_last(x) -> np.ndarray:
    """torch (b, c, t, h, w) -> (b, t, h, w, c) float32 numpy."""
    return x.detach().float().permute(0, 2, 3, 4, 1).cpu().numpy()


# -- models, checkpoints and inputs ---------------------------------------------------------------


def wan_model(ctx: Context, name: str) -> tuple[ModelSpec, tuple[int, int, int]]:
    """The preset (toy config in the smoke run) and the (t, h, w) latent of its video size."""
    spec = get(name)
    frames, height, width = spec.defaults.num_frames, spec.defaults.height, spec.defaults.width
    if ctx.smoke:
        spec = dataclasses.replace(spec, config=SMOKE_CONFIGS[name])
        frames, height, width = SMOKE_VIDEOS[name]
    return spec, spec.geometry().latent_shape(frames, height, width)[:3]


def _digest(config) -> str:
    return hashlib.sha1(repr(config).encode()).hexdigest()[:12]


def _cached_checkpoint(ctx: Context, prefix: str, config, build, save) -> Path:
    """A random model saved once per config under the work dir.

    Built on the device (on the host CPU it takes ~10 s per billion parameters even on 16
    cores); the sections read their device peaks after this, see `vidax_memory`.
    """
    path = ctx.work / f"{prefix}-{_digest(config)}.safetensors"
    if not path.exists():
        start = time.perf_counter()
        ctx.work.mkdir(parents=True, exist_ok=True)
        model = build()
        tmp = path.with_suffix(".tmp")
        save(model, tmp)
        tmp.replace(path)
        del model
        print(f"   built {path.name} in {time.perf_counter() - start:.1f} s", flush=True)
    return path


def wan_checkpoint(ctx: Context, config: wan.WanConfig) -> Path:
    return _cached_checkpoint(
        ctx,
        "wan",
        config,
        lambda: wan.WanTransformer(config, rngs=nnx.Rngs(0)),
        lambda m, p: save_model(m, p, wan.key_map(config)),
    )


def vae_checkpoint(ctx: Context, config: wan_vae.WanVAEConfig) -> Path:
    return _cached_checkpoint(
        ctx, "wan-vae", config, lambda: wan_vae.WanVAE(config, rngs=nnx.Rngs(0)), wan_vae.save
    )


def step_inputs(config: wan.WanConfig, latent, batch: int = 2):
    """(x (b, t, h, w, c), timesteps (b,), text (b, s, text_dim)) float32, fixed seed."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *latent, config.in_channels), dtype=np.float32)
    t = np.full((batch,), 700.0, np.float32)
    text = rng.standard_normal((batch, config.text_len, config.text_dim), dtype=np.float32)
    return x, t, text


def sampling_inputs(spec: ModelSpec, latent):
    """(noise (1, t, h, w, c), prompt, negative prompt (1, s, text_dim)): embeddings zero past
    the prompt's tokens, as a text encoder pads them."""
    c = spec.config
    rng = np.random.default_rng(1)
    noise = rng.standard_normal((1, *latent, c.in_channels), dtype=np.float32)

    def embeds(tokens):
        e = rng.standard_normal((1, c.text_len, c.text_dim), dtype=np.float32)
        e[:, tokens:] = 0
        return e

    return noise, embeds(min(24, c.text_len)), embeds(1)


def vidax_conditioning(spec: ModelSpec, prompt: np.ndarray, negative: np.ndarray):
    family = pipeline.Adapter.of(spec)
    return tuple(
        family.conditioning(fit_prompt_embeds(spec, e), GUIDANCE) for e in (prompt, negative)
    )


# -- sections -------------------------------------------------------------------------------------


@section("ceilings", cap_s=20, headline=("matmul_tflops", "copy_tbps"), row=_ceilings_row)
def ceilings(ctx: Context) -> dict:
    """Measured bf16 matmul rate (8192^3) and device-to-device copy bandwidth, through JAX."""
    n, chain = (256, 4) if ctx.smoke else (8192, 10)
    copy_bytes = 4 * 2**20 if ctx.smoke else 4 * GIB
    ka, kb, kc = jax.random.split(jax.random.key(0), 3)
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    # b ~ N(0, 1/n) keeps the chained products' scale, so no step over- or underflows.
    b = (jax.random.normal(kb, (n, n), jnp.float32) / math.sqrt(n)).astype(jnp.bfloat16)
    # Chained products (each needs the last) amortise the dispatch over `chain` kernels.
    products, _, _ = compile_jax(
        lambda a, b: jax.lax.fori_loop(0, chain, lambda i, c: c @ b, a), a, b
    )
    times, _ = time_jax(products, a, b, warmup=2, lo=10, hi=30, budget_s=0.4 * ctx.left())
    matmul = 2 * n**3 * chain / statistics.median(times) / 1e12
    x = jax.random.uniform(kc, (copy_bytes // 4,), jnp.float32)
    add, _, _ = compile_jax(lambda x: x + 1.0, x)  # one kernel: reads and writes every byte once
    times, _ = time_jax(add, x, warmup=2, lo=10, hi=50, budget_s=0.3 * ctx.left())
    return {
        "matmul_n": n,
        "matmul_tflops": matmul,
        "copy_gib": 2 * copy_bytes / GIB,
        "copy_tbps": 2 * copy_bytes / statistics.median(times) / 1e12,
    }


def vidax_step(ctx, path, config, inputs, flops) -> Side:
    before = jax_peak_bytes()
    model = wan.load(path, config)
    graphdef, state = nnx.split(model)
    args = [jnp.asarray(a) for a in inputs]
    step, compile_s, program = compile_jax(
        lambda state, x, t, text: nnx.merge(graphdef, state)(x, t, text), state, *args
    )
    times, out = time_jax(step, state, *args, budget_s=0.3 * ctx.left())
    fields = {"vidax_compile_s": compile_s, **timing_fields("vidax", times, flops, ctx)}
    grid = zip(inputs[0].shape[1:4], config.patch_size, strict=True)
    fields |= attention_share(ctx, config, tokens=math.prod(d // p for d, p in grid))
    return Side({**fields, **vidax_memory(before, program)}, np.asarray(out))


def attention_share(ctx: Context, config, *, tokens: int, batch: int = 2) -> dict:
    """Where the step's time goes: its self- and cross-attention alone (`attention("auto")` on
    random q, k, v at one block's shapes, over all the layers); the rest of the step is the
    projections and MLPs, norms, RoPE and modulation."""
    n, k, layers = config.num_heads, config.head_dim, config.num_layers
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.standard_normal((batch, tokens, n, k)), config.dtype)
    text = jnp.asarray(rng.standard_normal((batch, config.text_len, n, k)), config.dtype)
    fields = {}
    for label, keys in (("self", q), ("cross", text)):
        # One program of `layers` chained calls (each layer's queries are the last output), as
        # in the step: no dispatch per layer, nothing for XLA to share between them.
        def chain(q, kv):
            return jax.lax.fori_loop(0, layers, lambda i, q: attention(q, kv, kv), q)

        run, _, _ = compile_jax(chain, q, keys)
        times, _ = time_jax(run, q, keys, lo=3, hi=20, budget_s=0.05 * ctx.left())
        fields[f"vidax_{label}_attn_ms"] = 1e3 * statistics.median(times)
    return fields


def diffusers_step(ctx, path, config, inputs, flops) -> Side:
    torch, device = torch_device(ctx)
    model = diffusers_wan(path, config, device)
    dtype = _torch_dtype(torch, config.dtype)
    x, t, text = inputs
    x, text = channels_first(torch, x, device, dtype), torch.from_numpy(text).to(device, dtype)
    t = torch.from_numpy(t).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        times, out = time_torch(
            lambda: model(x, t, text, return_dict=False)[0], device, budget_s=0.6 * ctx.left()
        )
    fields = timing_fields("diffusers", times, flops, ctx)
    peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
    return Side({**fields, "diffusers_peak_gib": peak}, channels_last(out))


def compare_step(ctx: Context, config: wan.WanConfig, latent) -> dict:
    """One transformer forward at CFG batch 2, vidax (jit) vs diffusers, same weights/inputs."""
    flops = step_flops(config, latent)
    pt, ph, pw = config.patch_size
    tokens = (latent[0] // pt) * (latent[1] // ph) * (latent[2] // pw)
    ctx.record(latent=list(latent), tokens=tokens, batch=2, tflop=flops / 1e12, dtype=config.dtype)
    attention, why = attention_choice(config, tokens)
    ctx.record(attention=attention, attention_reason=why)
    path = wan_checkpoint(ctx, config)
    inputs = step_inputs(config, latent)
    ours = ctx.side("vidax", vidax_step, ctx, path, config, inputs, flops)
    ref = ctx.side("diffusers", diffusers_step, ctx, path, config, inputs, flops)
    if ours is None or ref is None:
        return {}
    return {
        "ratio": ours.fields["vidax_ms"] / ref.fields["diffusers_ms"],
        "max_rel_diff": rel_diff(ours.output, ref.output),
    }


_STEP_HEADLINE = ("vidax_ms", "diffusers_ms", "ratio", "vidax_tflops", "max_rel_diff")


@section("wan-step", cap_s=95, headline=(*_STEP_HEADLINE, "vidax_mfu"), row=_step_row)
def wan_step(ctx: Context) -> dict:
    """Wan 2.1 1.3B, all 30 layers, 81x480x832 (latent 21x60x104), CFG batch 2, bf16."""
    spec, latent = wan_model(ctx, "wan2.1-1.3b")
    return {"model": spec.name, **compare_step(ctx, spec.config, latent)}


@section("vae-decode", cap_s=60, headline=("vidax_ms", "diffusers_ms", "ratio"), row=_vae_row)
def vae_decode(ctx: Context) -> dict:
    """Wan 2.1 VAE decode of 81 frames at 480x832 (latent 21x60x104), float32 as Wan runs it."""
    name = "tiny" if ctx.smoke else "wan2.1"
    config = wan_vae.PRESETS[name]
    latent = SMOKE_VAE_LATENT if ctx.smoke else (21, 60, 104)
    z = np.random.default_rng(2).standard_normal((1, *latent, config.z_dim), dtype=np.float32)
    frames = config.video_frames(latent[0])
    ctx.record(vae=name, latent=list(latent), frames=frames, dtype=config.dtype)
    path = vae_checkpoint(ctx, config)
    ours = ctx.side("vidax", vidax_decode, ctx, path, config, z)
    ref = ctx.side("diffusers", diffusers_decode, ctx, path, config, z)
    if ours is None or ref is None:
        return {}
    return {
        "ratio": ours.fields["vidax_ms"] / ref.fields["diffusers_ms"],
        "max_rel_diff": rel_diff(ours.output, ref.output),
    }


def vidax_decode(ctx, path, config, z) -> Side:
    before = jax_peak_bytes()
    vae = wan_vae.load(path, config)
    graphdef, state = nnx.split(vae)
    z = jnp.asarray(z)
    # XLA:GPU would time every convolution algorithm on the device (minutes for this decoder;
    # docs/results.md); torch's default (cudnn.benchmark off) does not autotune either.
    decode, compile_s, program = compile_jax(
        lambda state, z: nnx.merge(graphdef, state).decode(z),
        state,
        z,
        compiler_options={"xla_gpu_autotune_level": 0},
    )
    times, out = time_jax(decode, state, z, warmup=1, lo=1, hi=5, budget_s=0.3 * ctx.left())
    fields = {"vidax_compile_s": compile_s, **timing_fields("vidax", times, None, ctx)}
    return Side({**fields, **vidax_memory(before, program)}, np.asarray(out))


def diffusers_decode(ctx, path, config, z) -> Side:
    torch, device = torch_device(ctx)
    model = diffusers_vae(path, config, device)
    # vidax decodes normalised latents; diffusers' decode takes raw ones (its pipelines
    # denormalise first).
    raw = z * np.asarray(config.latents_std, np.float32) + np.asarray(
        config.latents_mean, np.float32
    )
    raw = channels_first(torch, raw, device, _torch_dtype(torch, config.dtype))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        times, out = time_torch(
            lambda: model.decode(raw).sample,
            device,
            warmup=1,
            lo=1,
            hi=5,
            budget_s=0.6 * ctx.left(),
        )
    fields = timing_fields("diffusers", times, None, ctx)
    peak = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
    return Side({**fields, "diffusers_peak_gib": peak}, channels_last(out))


def vidax_sampling(ctx, path, spec, inputs, steps: int, *, reserve_s: float) -> Side:
    """vidax's sampler, `vidax.pipeline.denoise` (the whole loop under one jit), timed by
    `time_first_call` leaving `reserve_s` of the cap to what follows."""
    model = wan.load(path, spec.config)
    noise, prompt, negative = inputs
    cond, neg = vidax_conditioning(spec, prompt, negative)
    solver = sampling.make_solver("unipc", steps, SHIFT)
    noise = jnp.asarray(noise)

    def run():
        return pipeline.denoise(model, noise, cond, neg, solver=solver, guidance=GUIDANCE)

    seconds, how, out = time_first_call(ctx, run, reserve_s=reserve_s)
    fields = {"vidax_s": seconds, **{f"vidax_{k}": v for k, v in how.items()}}
    return Side(fields, np.asarray(out))


def diffusers_sampling(ctx, path, spec, inputs, steps: int, *, budget_s: float) -> Side:
    """The denoising loop of diffusers' `WanPipeline.__call__` (two transformer calls per step,
    CFG on their outputs, `UniPCMultistepScheduler` as Wan 2.1 configures it), without the text
    encoder and VAE."""
    torch, device = torch_device(ctx)
    diffusers = diffusers_module()
    model = diffusers_wan(path, spec.config, device)
    dtype = _torch_dtype(torch, spec.config.dtype)
    noise, prompt, negative = inputs
    noise = channels_first(torch, noise, device, torch.float32)
    prompt, negative = (torch.from_numpy(e).to(device, dtype) for e in (prompt, negative))

    def loop():
        scheduler = diffusers.UniPCMultistepScheduler(
            prediction_type="flow_prediction",
            use_flow_sigmas=True,
            flow_shift=SHIFT,
            solver_order=2,
        )
        scheduler.set_timesteps(steps, device=device)
        scheduler.set_begin_index(0)
        latents = noise
        for t in scheduler.timesteps:
            x = latents.to(dtype)
            timestep = t.expand(latents.shape[0])
            cond = model(x, timestep, prompt, return_dict=False)[0]
            uncond = model(x, timestep, negative, return_dict=False)[0]
            velocity = uncond + GUIDANCE * (cond - uncond)
            latents = scheduler.step(velocity, t, latents, return_dict=False)[0]
        return latents

    with torch.inference_mode():
        # Warm-up: one forward (kernel selection, handles); then whole loops.
        t = torch.full((1,), 999.0, device=device)
        time_torch(
            lambda: model(noise.to(dtype), t, prompt, return_dict=False),
            device,
            warmup=0,
            lo=1,
            hi=1,
        )
        times, out = time_torch(loop, device, warmup=0, lo=1, hi=3, budget_s=budget_s)
    return Side({"diffusers_s": statistics.median(times)}, channels_last(out))


def _estimates(ctx: Context, config, latent) -> tuple[float, float, float]:
    """(vidax s, diffusers s) per CFG step and vidax compile s, from wan-step if it ran on this
    model and size, else from the FLOPs at a third of the ceiling (a generous guess)."""
    prior = ctx.prior("wan-step")
    if prior.get("latent") == list(latent) and prior.get("vidax_ms"):
        v = prior["vidax_ms"] / 1e3
        d = (prior.get("diffusers_ms") or prior["vidax_ms"]) / 1e3
        return v, d, prior.get("vidax_compile_s", 60.0)
    ceiling = ctx.prior("ceilings").get("matmul_tflops") or (1.0 if ctx.smoke else 300.0)
    guess = step_flops(config, latent) / (ceiling * 1e12 / 3)
    return guess, guess, 10.0 if ctx.smoke else 60.0


@section(
    "generate",
    cap_s=75,
    headline=("vidax_s_full", "diffusers_s_full", "ratio"),
    row=_generate_row,
)
def generate(ctx: Context) -> dict:
    """A 50-step UniPC denoising loop of Wan 2.1 1.3B at 480p from given prompt embeddings."""
    spec, latent = wan_model(ctx, "wan2.1-1.3b")
    v, d, compile_s = _estimates(ctx, spec.config, latent)
    # One loop each (vidax's first call compiles too), the models' loading, a margin.
    fit = int((0.9 * ctx.left() - 1.2 * compile_s - 15) / (v + d))
    steps = max(2, min(STEPS, fit))
    if ctx.smoke:
        steps = STEPS // 2  # exercises the scaling below
    if steps < STEPS:
        ctx.scaled(f"ran {steps} of {STEPS} steps; *_s_full = measured x {STEPS}/{steps}")
    ctx.record(
        model=spec.name,
        latent=list(latent),
        steps=STEPS,
        steps_run=steps,
        scheduler=f"UniPC order 2 shift {SHIFT}, CFG {GUIDANCE}",
    )
    path = wan_checkpoint(ctx, spec.config)
    inputs = sampling_inputs(spec, latent)
    scale = STEPS / steps
    diffusers_s = 1.1 * (steps + 1) * d + 10  # its warm-up forward, one loop, loading
    ours = ctx.side("vidax", vidax_sampling, ctx, path, spec, inputs, steps, reserve_s=diffusers_s)
    if ours is not None:
        ctx.record(vidax_s_full=ours.fields["vidax_s"] * scale)
    ref = ctx.side(
        "diffusers", diffusers_sampling, ctx, path, spec, inputs, steps, budget_s=0.5 * ctx.left()
    )
    if ref is not None:
        ctx.record(diffusers_s_full=ref.fields["diffusers_s"] * scale)
    if ours is None or ref is None:
        return {}
    return {
        "ratio": ours.fields["vidax_s"] / ref.fields["diffusers_s"],
        "latent_rel_diff": rel_diff(ours.output, ref.output),
    }


@section(
    "dvg",
    cap_s=70,
    headline=("full_s", f"b{DVG_BUDGETS[0]}_s", f"b{DVG_BUDGETS[0]}_speedup"),
    row=_dvg_row,
)
def dvg_section(ctx: Context) -> dict:
    """Wall-clock of DVG's selected schedules vs the full 50-step sampler (random weights)."""
    spec, latent = wan_model(ctx, "wan2.1-1.3b")
    path = wan_checkpoint(ctx, spec.config)
    inputs = sampling_inputs(spec, latent)
    full_s, source = _full_sampler_seconds(ctx, spec, latent, path, inputs)
    ctx.record(model=spec.name, latent=list(latent), steps=STEPS, full_s=full_s, full_source=source)

    model = wan.load(path, spec.config)
    noise, prompt, negative = inputs
    cond, neg = vidax_conditioning(spec, prompt, negative)
    solver = sampling.make_solver("unipc", STEPS, SHIFT)
    policy = dvg.Policy(spatial=spec.dvg_spatial)
    noise = jnp.asarray(noise)
    # DVG at each budget, and at the first with the step cache inside its stages: the skip plan
    # the cache's rules make for a calibration in which every step changes alike (random
    # weights: nothing to calibrate), the plan benchmarks/dvg.py's FLOP table states.
    skip = sampling.step_cache.uniform_skips(STEPS)
    ctx.record(cache_skip_rate=sum(skip) / STEPS)
    compile_s = 0.0
    for i, (label, budget, steps_skip) in enumerate(_dvg_runs(skip)):
        # Each run's first call compiles its probe and schedule programs and runs about
        # budget x the full sampler; one timed call follows if it fits. The first run comes
        # first: a later one runs only if the time left holds its compile and a run.
        if i and ctx.left() < compile_s + 1.3 * budget * full_s:
            ctx.scaled(f"{label} skipped: {ctx.left():.0f} s left")
            continue
        choices = []

        def run(budget=budget, steps_skip=steps_skip, choices=choices):
            latents, picked = dvg.accelerate(
                model,
                noise,
                cond,
                neg,
                solver=solver,
                guidance=GUIDANCE,
                accel="dvg",
                budget=budget,
                policy=policy,
                skip=steps_skip,
            )
            choices[:] = picked
            return latents

        seconds, how, _ = time_first_call(ctx, run, hi=1)
        compile_s = how["compile_s"]
        ctx.record(
            **{f"{label}_{k}": v for k, v in how.items()},
            **{
                f"{label}_s": seconds,
                f"{label}_speedup": full_s / seconds,
                f"{label}_schedule": choices[0].schedule.describe(),
                f"{label}_cost": choices[0].cost,
            },
        )
    return {}


def _dvg_runs(skip) -> list[tuple[str, float, tuple[bool, ...] | None]]:
    """(label, budget, skip) of the dvg section's runs, in the order they run."""
    first = DVG_BUDGETS[0]
    runs = [(f"b{first}", first, None), (f"b{first}+cache", first, skip)]
    return runs + [(f"b{b}", b, None) for b in DVG_BUDGETS[1:]]


def _full_sampler_seconds(ctx: Context, spec, latent, path, inputs) -> tuple[float, str]:
    """vidax's full 50-step sampler: from the generate section if it ran on this model and
    size, else timed here (over fewer steps, scaled, when the cap asks)."""
    prior = ctx.prior("generate")
    if prior.get("latent") == list(latent) and prior.get("vidax_s_full"):
        source = "generate section"
        if prior.get("steps_run") != STEPS:
            source += f", scaled from {prior['steps_run']} steps"
        return prior["vidax_s_full"], source
    v, _, compile_s = _estimates(ctx, spec.config, latent)
    steps = max(2, min(STEPS, int((0.4 * ctx.left() - 1.2 * compile_s) / v)))
    if steps < STEPS:
        ctx.scaled(f"full sampler timed over {steps} of {STEPS} steps, scaled")
    side = vidax_sampling(ctx, path, spec, inputs, steps, reserve_s=ctx.left())
    return side.fields["vidax_s"] * STEPS / steps, f"timed here over {steps} steps"


@section(
    "wan14b-step",
    cap_s=55,
    headline=(*_STEP_HEADLINE, "layers", "vidax_ms_full_est"),
    row=_step_row,
)
def wan14b_step(ctx: Context) -> dict:
    """Wan 2.1 14B at 720p (latent 21x90x160), CFG batch 2, bf16, with as many of its 40 layers
    as fit the cap; times are scaled to full depth by the FLOP ratio."""
    spec, latent = wan_model(ctx, "wan2.1-14b")
    full = spec.config
    layers = _layers_that_fit(ctx, full, latent)
    if ctx.smoke:
        layers = min(layers, full.num_layers - 1)  # exercises the scaling below
    config = dataclasses.replace(full, num_layers=layers)
    scale = step_flops(full, latent) / step_flops(config, latent)
    if layers < full.num_layers:
        ctx.scaled(
            f"ran {layers} of {full.num_layers} layers; *_full_est = measured x {scale:.3g} "
            "(the FLOP ratio)"
        )
    ctx.record(model=spec.name, layers=layers, full_layers=full.num_layers)
    result = compare_step(ctx, config, latent)
    for side in ("vidax", "diffusers"):
        ms = ctx.results.get(f"{side}_ms")
        if ms is not None:
            result[f"{side}_ms_full_est"] = ms * scale
    return result


def _layers_that_fit(ctx: Context, full: wan.WanConfig, latent) -> int:
    """Layers whose 24 forwards (2 warm-up + 10 timed, each side), compile and checkpoint I/O
    fit in 80% of the time left, from the rate wan-step achieved (else a third of the ceiling)."""
    per_layer = step_flops(dataclasses.replace(full, num_layers=2), latent) - step_flops(
        dataclasses.replace(full, num_layers=1), latent
    )
    layer_s = 24 * per_layer / (_rate_tflops(ctx) * 1e12) + (0.5 if ctx.smoke else 4.0)  # + I/O
    compile_s = 1.5 * ctx.prior("wan-step").get("vidax_compile_s", 10.0 if ctx.smoke else 40.0)
    fit = int((0.8 * ctx.left() - compile_s - 10) / layer_s)
    return max(1, min(full.num_layers, fit))


def _rate_tflops(ctx: Context) -> float:
    """TFLOP/s to plan with: the slower side of wan-step, else a third of the ceiling."""
    prior = ctx.prior("wan-step")
    rates = [prior.get(f"{s}_tflops") for s in ("vidax", "diffusers")]
    rates = [r for r in rates if r]
    ceiling = ctx.prior("ceilings").get("matmul_tflops")
    return min(rates) if rates else (ceiling / 3 if ceiling else (0.01 if ctx.smoke else 200.0))


@section(
    "pbsa",
    cap_s=60,
    headline=("dense_ms", "kernel_ms_30", "speedup_30", "key_rate_30", "max_rel_err"),
    row=_pbsa_row,
)
def pbsa_section(ctx: Context) -> dict:
    """Sparse Forcing's block-sparse attention (PBSA) at Wan 1.3B 480p: the kernel against dense
    attention over the whole pool at 100/50/30/15% of the blocks, and against its reference."""
    z = SMOKE_PBSA_SIZES if ctx.smoke else PBSA_SIZES
    n, hd, bs, bq = z["heads"], z["head_dim"], z["block"], z["block_q"]
    lq, slots = z["chunk"] * z["frame"], z["pool_frames"] * z["frame"] // bs
    nq, dtype = lq // bq, jnp.bfloat16
    # On the CPU the kernel runs interpreted (the TPU kernel): a check, not a measurement.
    kernel = functools.partial(pbsa, block_q=bq, interpret=ctx.smoke)
    backend = "tpu (interpreted)" if ctx.smoke else jax.default_backend()
    rng = np.random.default_rng(3)

    def inputs(n_kv: int):
        q = jnp.asarray(rng.standard_normal((1, n, lq, hd)), dtype)
        pool = [jnp.asarray(rng.standard_normal((1, n_kv, slots, bs, hd)), dtype) for _ in "kv"]
        return q, *pool

    def selection(n_kv: int, count: int, ragged: bool):
        """Distinct random slots per query tile (what a top-k gives); ragged: fewer, some none."""
        idx = np.argsort(rng.random((1, n_kv, nq, slots)), axis=-1)[..., :count]
        cnt = np.full((1, n_kv, nq), count)
        if ragged:
            cnt = rng.integers(0, count + 1, cnt.shape)
            cnt.flat[0] = 0  # at least one empty row
        return jnp.asarray(idx, jnp.int32), jnp.asarray(cnt, jnp.int32)

    def key_angles(n_kv: int):  # RoPE angles per slot, as Sparse Forcing's time lanes get
        return jnp.asarray(rng.uniform(-30.0, 30.0, (1, n_kv, slots, hd // 2)), jnp.float32)

    # Correctness first, on fresh selections with ragged counts, empty rows, partly filled
    # slots, with and without GQA (2 query heads per KV head), and with RoPE on read.
    errors, rotated_errors = [], []
    reference = jax.jit(functools.partial(pbsa_reference, block_q=bq))
    for n_kv in (n, n // 2):
        q, pk, pv = inputs(n_kv)
        idx, cnt = selection(n_kv, max(1, slots // 3), ragged=True)
        lens = jnp.asarray(rng.integers(1, bs + 1, (1, n_kv, slots)), jnp.int32)
        ours = jax.jit(kernel)(q, pk, pv, idx, cnt, slot_len=lens)
        ref = reference(q, pk, pv, idx, cnt, slot_len=lens)
        errors.append(rel_diff(np.asarray(ours), np.asarray(ref)))
        angles = key_angles(n_kv)
        ours = jax.jit(kernel)(q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles)
        ref = reference(q, rotate_keys(pk, angles), pv, idx, cnt, slot_len=lens)
        rotated_errors.append(rel_diff(np.asarray(ours), np.asarray(ref)))
    ctx.record(
        backend=backend,
        max_rel_err=max(errors),
        max_rel_err_rotated=max(rotated_errors),
        lq=lq,
        keys=slots * bs,
        slots=slots,
    )

    q, pk, pv = inputs(n)
    keys = pk.reshape(1, n, slots * bs, hd).transpose(0, 2, 1, 3)
    values = pv.reshape(1, n, slots * bs, hd).transpose(0, 2, 1, 3)
    qt = q.transpose(0, 2, 1, 3)
    # The dense baseline is what a dense Self-Forcing layer runs: `attention(impl="auto")`.
    platform_name, capability = attention_device()
    impl, why = choose_impl(
        platform_name, qt.shape, keys.shape, dtype, False, compute_capability=capability
    )
    dense, _, _ = compile_jax(lambda q, k, v: attention(q, k, v), qt, keys, values)
    times, _ = time_jax(dense, qt, keys, values, budget_s=0.1 * ctx.left())
    dense_s = statistics.median(times)
    flops = 4 * n * lq * slots * bs * hd
    ctx.record(
        dense_impl=impl,
        dense_reason=why,
        dense_ms=1e3 * dense_s,
        dense_tflops=flops / dense_s / 1e12,
    )
    for i, frac in enumerate(PBSA_FRACTIONS):
        p = round(100 * frac)
        idx, cnt = selection(n, max(1, round(frac * slots)), ragged=False)
        run, _, _ = compile_jax(kernel, q, pk, pv, idx, cnt)
        share = 0.6 / (len(PBSA_FRACTIONS) - i)  # of the time left, so each fraction gets one
        times, out = time_jax(
            run, q, pk, pv, idx, cnt, lo=3 if ctx.smoke else 10, budget_s=share * ctx.left()
        )
        s = statistics.median(times)
        # Per-key throughput relative to dense: 1.0 = as many keys a second as dense attention.
        ctx.record(
            **{
                f"kernel_ms_{p}": 1e3 * s,
                f"speedup_{p}": dense_s / s,
                f"key_rate_{p}": frac * dense_s / s,
            }
        )
        if p == 30:  # the XLA reference (gather, attend) at the fraction the headline reads
            ref, _, _ = compile_jax(
                functools.partial(pbsa_reference, block_q=bq), q, pk, pv, idx, cnt
            )
            times, _ = time_jax(ref, q, pk, pv, idx, cnt, lo=3, budget_s=0.1 * ctx.left())
            ctx.record(reference_ms_30=1e3 * statistics.median(times))
            sweep, base = (q, pk, pv, idx, cnt), np.asarray(out)
            # RoPE on read: what rotating every read block costs the kernel.
            rot = functools.partial(kernel, key_angles=key_angles(n))
            run, _, _ = compile_jax(rot, *sweep)
            times, _ = time_jax(run, *sweep, lo=3, budget_s=0.1 * ctx.left())
            ctx.record(kernel_rotated_ms_30=1e3 * statistics.median(times))
    # The TPU kernel's tiles, at 30%, with the time left (the GPU kernel reads one block per
    # step and its rows are bounded by registers: nothing to sweep): key rows per inner step
    # (`block_kv`) and query rows per program (`block_q`: each program reads its tile's
    # selected keys, so fewer programs per selection tile read fewer keys). A tile the chip
    # refuses (VMEM) is noted and skipped.
    if ctx.smoke or backend == "tpu":
        tiles = {f"kv{n}": BlockSizes(block_kv=n) for n in PBSA_BLOCK_KV}
        tiles |= {f"q{r}": BlockSizes(block_q=r) for r in (bq // 2, bq)}
        for i, (label, sizes) in enumerate(tiles.items()):
            if ctx.left() < (2.0 if ctx.smoke else 6.0):
                ctx.scaled(f"tile sweep stopped before {label}: out of time")
                break
            try:
                run, _, _ = compile_jax(functools.partial(kernel, block_sizes=sizes), *sweep)
                share = 0.5 / (len(tiles) - i)
                times, out = time_jax(run, *sweep, lo=3, budget_s=share * ctx.left())
            except Exception as e:  # the chip's refusal is the result: note it, go on
                ctx.scaled(f"tiles {label} failed: {type(e).__name__}: {str(e)[:160]}")
                continue
            # Tiles change the order of the online softmax's sums, not the result.
            diff = max(
                ctx.results.get("block_kv_max_rel_diff", 0.0), rel_diff(np.asarray(out), base)
            )
            ctx.record(
                **{f"kernel_ms_30_{label}": 1e3 * statistics.median(times)},
                block_kv_max_rel_diff=diff,
            )
    return {}


def decode_configs(
    frame_tokens: int, block: int, tile: int, backend: str, *, sparse_block: int | None = None
) -> dict[str, ForcingConfig]:
    """tiny-causal's dense and sparse configurations for frames of `frame_tokens` tokens.

    Dense cuts frames into blocks of `block` tokens, sparse into blocks of `sparse_block`
    (default `block`). The sparse one keeps its sink, window and
    chunk; its block budgets (memory, local and memory top-k, compressed ring) are scaled by the
    blocks per frame, so they cover the same share of a frame; it selects per tile of `tile`
    queries through PBSA `backend`, and its memory's reach is bounded so that sink + window +
    memory span dense's sink + window (equal context span, `benchmarks/sparse_forcing.py`'s
    comparison (a)).
    """
    preset = get_causal("tiny-causal")
    spec = preset.spec
    _, h, w, _ = spec.geometry().latent_shape(1, spec.defaults.height, spec.defaults.width)
    _, ph, pw = spec.config.patch_size
    dense, sparse = preset.dense, preset.sparse
    sparse_block = block if sparse_block is None else sparse_block
    ratio = -(-frame_tokens // sparse_block) / sparse.layout((h // ph, w // pw)).blocks_per_frame
    budgets = ("memory_blocks", "local_topk", "memory_topk", "compressed_tokens")
    sparse = dataclasses.replace(
        sparse,
        block_size=sparse_block,
        query_tile=tile,
        memory_frames=dense.context_frames - sparse.sink_frames - sparse.window_frames,
        pbsa_backend=backend,
        **{n: round(getattr(sparse, n) * ratio) for n in budgets},
    )
    # The same function with the sink and chunk blocks attended densely (`dense_shared`, a
    # PBSA backend: the reference where the CPU's "gather" would compute it in one piece).
    shared = dataclasses.replace(
        sparse, dense_shared=True, pbsa_backend="reference" if backend == "gather" else backend
    )
    return {
        "dense": dataclasses.replace(dense, block_size=block),
        "sparse": sparse,
        "sparse_shared": shared,
    }


def peak_kv_bytes(config: wan.WanConfig, layout: CacheLayout) -> int:
    """Key/value bytes alive while a chunk is denoised (batch 1): the cache buffers of every
    layer (`KVCache.nbytes`, as `CausalWan.init_cache` allocates them) plus the chunk's own keys
    and values."""
    c = config
    cache = jax.eval_shape(
        lambda: init_cache(
            layout,
            num_layers=c.num_layers,
            batch=1,
            num_heads=c.num_heads,
            head_dim=c.head_dim,
            dtype=c.compute_dtype,
        )
    )
    chunk = 2 * c.num_layers * layout.chunk_tokens * c.num_heads * c.head_dim
    return cache.nbytes() + chunk * c.compute_dtype.itemsize


def _decode_layer_flops(config: wan.WanConfig, tokens: int, keys: int) -> float:
    """Matmul FLOPs of one Wan block on a chunk of `tokens` queries over `keys` keys (cache +
    chunk), 2 per multiply-add: projections, FFN, self- and cross-attention."""
    d, f, s = config.dim, config.ffn_dim, config.text_len
    return 2 * tokens * d * (6 * d + 2 * f) + 4 * s * d * d + 4 * tokens * (keys + s) * d


def _decode_layers(ctx: Context, full: wan.WanConfig, tokens: int, keys: int, forwards: int):
    """Layers whose `forwards` chunk forwards (both layouts priced as dense) fit in 80% of the
    time left after compiling, from the rate wan-step achieved (else a third of the ceiling).

    Compiling does not grow with depth (the layers are scanned): a write and a forward per
    layout and five one-layer attentions; seven programs (two layouts) took about 50 s on a TPU
    v5e at full size, so eleven are priced at 75 s.
    """
    layer_s = forwards * _decode_layer_flops(full, tokens, keys) / (_rate_tflops(ctx) * 1e12)
    compile_s = 8.0 if ctx.smoke else 75.0
    fit = int((0.8 * ctx.left() - compile_s) / layer_s)
    return max(1, min(full.num_layers, fit))


@section(
    "decode",
    cap_s=60,
    headline=("dense_ms", "sparse_ms", "speedup", "kv_ratio", "overhead_ms", "layers"),
    row=_decode_row,
)
def decode_section(ctx: Context) -> dict:
    """Chunked decoding, Wan 1.3B-sized causal model at 480p: dense vs sparse chunk forward.

    A random-weight `CausalWan` (bf16, batch 1, as many of the 30 layers as fit the cap and the
    device's memory; ms scaled to full depth by the layer ratio in `*_full_est`) runs
    tiny-causal's layouts at 1560 tokens a frame (`decode_configs`): dense (Self-Forcing: sink 3
    + window 15 frames), sparse (Sparse Forcing at equal context span, through the PBSA kernel
    `pbsa_backend="auto"` picks; the XLA gather path on a CPU) and sparse with `dense_shared`
    (the sink and chunk blocks every tile lists in one dense kernel call). Each cache is filled
    to steady state with `write_clean` (window full, memory and compressed ring cycling,
    positions past the horizon); then one `chunk_velocity` at steady state is timed: one
    denoising step of a 3-frame chunk (a chunk costs `forwards_per_chunk` of them, the clean
    pass included).

    Overhead of selection/compression: one layer's `sparse_attention` on that cache minus its
    selected branch alone (the same pool, then PBSA over lists of the same length),
    i.e. block compression, scoring, top-k, the compressed branch and the branch combination;
    times the layers for a forward. Peak KV: `peak_kv_bytes` at full depth.
    """
    spec, latent = wan_model(ctx, "wan2.1-1.3b")
    full = spec.config
    hw = SMOKE_DECODE_LATENT_HW if ctx.smoke else latent[1:]
    z = SMOKE_PBSA_SIZES if ctx.smoke else PBSA_SIZES
    _, ph, pw = full.patch_size
    grid = (hw[0] // ph, hw[1] // pw)
    # What pbsa_backend="auto" runs on this platform, named so that the isolated selected
    # branch below runs the same.
    backend = {"cpu": "gather", "tpu": "tpu"}.get(jax.default_backend(), "triton")
    configs = decode_configs(
        grid[0] * grid[1], z["block"], z["block_q"], backend, sparse_block=z["sparse_block"]
    )
    layouts = {name: cfg.layout(grid) for name, cfg in configs.items()}
    dense, sparse = layouts["dense"], layouts["sparse"]
    kv = {name: peak_kv_bytes(full, layout) for name, layout in layouts.items()}
    ctx.record(
        model=spec.name,
        latent_hw=list(hw),
        tokens_per_frame=dense.tokens_per_frame,
        chunk_tokens=dense.chunk_tokens,
        context_frames=configs["dense"].context_frames,
        dense_context_tokens=configs["dense"].context_frames * dense.tokens_per_frame,
        sparse_selected_tokens=sparse.max_selected * sparse.block_size,
        sparse_compressed_tokens=sparse.num_slots + sparse.config.compressed_tokens,
        sparse_cache_tokens=sparse.cache_tokens(),
        block=sparse.block_size,
        query_tile=sparse.query_tile,
        sparse_budgets=(
            f"memory {sparse.config.memory_blocks} blocks ({sparse.config.memory_frames} "
            f"frames), top-k local {sparse.config.local_topk} memory "
            f"{sparse.config.memory_topk}, compressed ring {sparse.config.compressed_tokens}"
        ),
        sparse_backend=backend,
        forwards_per_chunk=configs["dense"].num_steps + 1,
        dense_kv_gib=kv["dense"] / GIB,
        sparse_kv_gib=kv["sparse"] / GIB,
        kv_ratio=kv["sparse"] / kv["dense"],
        dtype=full.dtype,
    )

    # Chunks written before the timed one: every cache full and a chunk more, so the window
    # ring, the memory (at its reach) and the compressed ring have all been overwritten once.
    steady = 1 + max(
        c.sink_chunks + c.window_chunks + c.memory_frames // c.chunk_frames
        for c in configs.values()
    )
    lo = 3 if ctx.smoke else 5
    keys = dense.chunk_tokens + configs["dense"].context_frames * dense.tokens_per_frame
    layers = _decode_layers(ctx, full, dense.chunk_tokens, keys, len(layouts) * (steady + 2 + lo))
    if ctx.smoke:
        layers = min(layers, full.num_layers - 1)  # exercises the scaling below
    layers, programs = _decode_programs(ctx, full, layers, layouts, hw)
    scale = full.num_layers / layers
    if layers < full.num_layers:
        ctx.scaled(f"ran {layers} of {full.num_layers} layers; *_full_est = measured x {scale:.3g}")
    ctx.record(layers=layers, full_layers=full.num_layers, steady_chunk=steady)

    model = CausalWan(dataclasses.replace(full, num_layers=layers), rngs=nnx.Rngs(0))
    state = nnx.state(model)
    rng = np.random.default_rng(4)
    text = jnp.asarray(rng.standard_normal((1, full.text_len, full.text_dim)), jnp.float32)
    x = jnp.asarray(
        rng.standard_normal((1, dense.config.chunk_frames, *hw, full.in_channels)), jnp.float32
    )
    chunk = jnp.int32(steady)
    results = {}
    for i, (name, layout) in enumerate(layouts.items()):
        write, forward = programs[name]
        start = time.perf_counter()
        cache = model.init_cache(layout, 1)
        for c in range(steady):  # the write program donates the cache: written in place
            cache = write(state, cache, text, jnp.int32(c))
        jax.block_until_ready(cache)
        ctx.record(**{f"{name}_fill_s": time.perf_counter() - start})
        share = 0.8 / (len(layouts) - i)  # of the time left: an equal part for each layout
        times, _ = time_jax(
            forward, state, cache, x, text, chunk, lo=lo, hi=20, budget_s=share * ctx.left()
        )
        fields = timing_fields(name, times, None, ctx)
        fields[f"{name}_ms_full_est"] = fields[f"{name}_ms"] * scale
        ctx.record(**fields, **_layer_attention(ctx, model, cache.layer(0), layout, steady))
        results[name] = fields[f"{name}_ms"]
        del cache
        _release()

    r = ctx.results
    overhead = (r["sparse_attn_ms"] - r["selected_attn_ms"]) * layers
    return {
        "speedup": results["dense"] / results["sparse"],
        "speedup_shared": results["dense"] / results["sparse_shared"],
        "overhead_ms": overhead,
        "overhead_ms_full_est": overhead * scale,
        "overhead_share": overhead / results["sparse"],
    }


def _decode_programs(ctx: Context, full: wan.WanConfig, layers: int, layouts: dict, hw):
    """Each layout's programs (`_decode_program`) at `layers` layers, with fewer layers while
    the largest needs more than 90% of the device's free memory, or a TPU compile refuses it
    (the dense clean pass of 30 layers at 480p asks 17.7 GiB of temporaries; a TPU v5e has
    15.7).

    Returns:
      (layers, {layout name: (write, forward)}).
    """
    stats = jax.devices()[0].memory_stats() or {}  # None on a CPU: no bound
    free = stats.get("bytes_limit", math.inf) - stats.get("bytes_in_use", 0)
    for attempt in range(4):
        config = dataclasses.replace(full, num_layers=layers)
        try:
            programs = {n: _decode_program(config, layout, hw) for n, layout in layouts.items()}
            largest = max(max(p[3], p[4]) for p in programs.values())
        except jax.errors.JaxRuntimeError as e:
            # A TPU compile refuses a program larger than the chip's memory outright (a GPU's
            # reports its size): read what it asked for from the message, or halve.
            if "RESOURCE_EXHAUSTED" not in str(e) or layers == 1 or attempt == 3:
                raise
            asked = re.search(r"required for HLO temporaries \(([\d.]+)G\)", str(e))
            free = min(free, _hbm_bytes(str(e), free))
            if not (asked and math.isfinite(free)):
                ctx.scaled(f"{layers} layers ran out of device memory")
                layers = max(1, layers // 2)
                continue
            largest = float(asked.group(1)) * GIB
            programs = None
        if programs is not None and (layers == 1 or largest <= 0.9 * free or attempt == 3):
            break
        ctx.scaled(f"{layers} layers need {largest / GIB:.1f} GiB, {free / GIB:.1f} GiB free")
        layers = max(1, min(int(layers * 0.9 * free / largest), layers - 1))
    for name, (_, _, seconds, _, forward_bytes) in programs.items():
        ctx.record(
            **{
                f"{name}_compile_s": seconds,
                f"{name}_program_gib": forward_bytes / GIB if forward_bytes else None,
            }
        )
    return layers, {name: p[:2] for name, p in programs.items()}


def _hbm_bytes(message: str, default: float) -> float:
    """The device memory an out-of-memory compile error names ("exceeds available HBM
    (15.75G)"), else `default`."""
    found = re.search(r"available HBM \(([\d.]+)G\)", message)
    return float(found.group(1)) * GIB if found else default


def _decode_program(config: wan.WanConfig, layout: CacheLayout, hw: tuple[int, int]):
    """A layout's two programs, compiled ahead of time from shapes (nothing is allocated):

    - write(state, cache, text, chunk) -> cache: the clean pass (`write_clean`) of a random
      latent chunk, the cache donated (written in place);
    - forward(state, cache, x, text, chunk) -> v: one `chunk_velocity` (first step's sigma).

    Returns:
      (write, forward, compile seconds of both, write bytes, forward bytes); bytes 0 where the
      backend reports none.
    """
    model = nnx.eval_shape(lambda: CausalWan(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    shape = (1, layout.config.chunk_frames, *hw, config.in_channels)
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    text = jax.ShapeDtypeStruct((1, config.text_len, config.text_dim), jnp.float32)
    chunk = jax.ShapeDtypeStruct((), jnp.int32)
    cache = jax.eval_shape(lambda: model.init_cache(layout, 1))

    def write(state, cache, text, chunk):
        x0 = jax.random.normal(jax.random.fold_in(jax.random.key(5), chunk), shape)
        return write_clean(nnx.merge(graphdef, state), x0, text, cache, chunk, layout)

    def forward(state, cache, x, text, chunk):
        model, sigma = nnx.merge(graphdef, state), layout.config.sigmas[0]
        return chunk_velocity(model, x, sigma, text, cache, chunk, layout)

    w, w_s, w_bytes = compile_jax(write, state, cache, text, chunk, donate_argnums=(1,))
    f, f_s, f_bytes = compile_jax(forward, state, cache, x, text, chunk)
    return w, f, w_s + f_s, w_bytes or 0, f_bytes or 0


def _layer_attention(ctx: Context, model: CausalWan, layer: KVCache, layout, chunk: int) -> dict:
    """ms of one layer's self-attention of the chunk over its steady-state cache (random q, k,
    v): dense, or sparse and its selected branch alone (PBSA over lists as long as
    `select_blocks` gives, random distinct slots of each region, and the chunk's own blocks)."""
    c, cfg = model.config, layout.config
    rng = np.random.default_rng(6)
    shape = (1, layout.chunk_tokens, c.num_heads, c.head_dim)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), c.dtype) for _ in "qkv")
    start = jnp.int32(chunk * cfg.chunk_frames)
    rope = make_rope(c.rope_axes_dims, c.rope_theta)
    budget = lambda: dict(lo=3, hi=20, budget_s=0.05 * ctx.left())

    def timed(fn, *args) -> float:
        run, _, _ = compile_jax(fn, *args)
        return 1e3 * statistics.median(time_jax(run, *args, **budget())[0])

    if not cfg.sparse:
        attend = lambda q, k, v, layer, start: dense_attention(q, k, v, layer, start, layout, rope)
        return {"dense_attn_ms": timed(lambda *a: attend(*a)[0], q, k, v, layer, start)}
    prefix = "shared_" if cfg.dense_shared else ""

    gd, sparse_state = nnx.split(model.sparse)
    params = jax.tree.map(lambda x: x[0], sparse_state)  # layer 0's, as `layer` is

    def full(q, k, v, layer, start, params):
        o, _ = sparse_attention(q, k, v, layer, start, layout, rope, nnx.merge(gd, params))
        return o

    regions = (
        (0, layout.sink_slots, layout.sink_slots),
        (layout.window_start, layout.window_slots, cfg.local_topk),
        (layout.memory_start, layout.memory_slots, cfg.memory_topk),
    )
    tiles = (1, c.num_heads, layout.num_query_tiles)
    lists = [lo + np.argsort(rng.random((*tiles, n)), -1)[..., :m] for lo, n, m in regions]
    own = np.broadcast_to(
        np.arange(layout.chunk_blocks) + layout.num_slots, (*tiles, layout.chunk_blocks)
    )
    idx = jnp.asarray(np.concatenate([*lists, own], -1), jnp.int32)
    scale = c.head_dim**-0.5

    backend = selected_backend(cfg.pbsa_backend)

    def selected(q, k, v, layer, start, idx, *, rotate_first: bool = False):
        pool_k, pool_v, lengths, qr, angles = _with_chunk(q, k, v, layer, start, layout, rope)
        if rotate_first:  # the pool joined and rotated in XLA, then read as stored (before)
            pool_k, angles = rotate_keys(jnp.concatenate(pool_k, axis=2), angles), None
            pool_v = jnp.concatenate(pool_v, axis=2)
        return selected_attention(
            qr, pool_k, pool_v, idx, lengths, layout, scale, backend=backend, key_angles=angles
        )

    def attend(qr, pool_k, pool_v, lengths, angles, idx):  # the branch minus its pool
        return selected_attention(
            qr, pool_k, pool_v, idx, lengths, layout, scale, backend=backend, key_angles=angles
        )

    # The pool built once outside the timed call: a program that returned it would copy the
    # cache into its outputs (runs 10-11 timed that copy as "the pool", docs/sparse_forcing.md).
    pool_k, pool_v, lengths, qr, angles = jax.jit(
        lambda q, k, v, layer, start: _with_chunk(q, k, v, layer, start, layout, rope)
    )(q, k, v, layer, start)
    out = {
        f"{prefix}sparse_attn_ms": timed(full, q, k, v, layer, start, params),
        f"{prefix}selected_attn_ms": timed(selected, q, k, v, layer, start, idx),
        f"{prefix}selected_kernel_ms": timed(attend, qr, pool_k, pool_v, lengths, angles, idx),
    }
    if not prefix:  # RoPE on read against rotating the pool first, side by side
        rotated = functools.partial(selected, rotate_first=True)
        rotation = lambda keys, frame, start: rotate_keys(
            keys, time_angles(frame, start, layout, rope)
        )
        args = (q, k, v, layer, start, idx)
        f32 = lambda fn: jax.jit(fn)(*args).astype(jnp.float32)
        out |= {
            "selected_rotate_first_ms": timed(rotated, *args),
            "rotation_ms": timed(rotation, layer.k, layer.frame, start),
            "rotate_on_read_max_diff": float(jnp.abs(f32(selected) - f32(rotated)).max()),
        }
    return out


# -- running --------------------------------------------------------------------------------------


def environment() -> dict:
    """Versions and the device, read in the worker."""
    device = jax.devices()[0]
    env = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "flax": getattr(sys.modules.get("flax"), "__version__", "?"),
        "numpy": np.__version__,
    }
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["torch_device"] = torch.cuda.get_device_name()
    except ImportError as e:
        env["torch"] = f"missing ({e})"
    try:
        env["diffusers"] = diffusers_module().__version__
    except RuntimeError as e:
        env["diffusers"] = str(e)
    return env


def _caps(overrides: list[str]) -> dict[str, float]:
    caps = {name: s.cap_s for name, s in SECTIONS.items()}
    for item in overrides:
        name, _, seconds = item.partition("=")
        if name not in SECTIONS or not seconds:
            raise SystemExit(f"--cap {item!r}: takes NAME=SECONDS, NAME one of {list(SECTIONS)}")
        caps[name] = float(seconds)
    return caps


def run_sections(names: list[str], report: Report, args) -> None:
    """Runs the sections in this process, one after the other, recording each."""
    caps = _caps(args.cap)
    inject = dict(item.partition("=")[::2] for item in args.inject)
    report.data["suite"].setdefault("env", environment())
    report.write()
    least = SMOKE_MIN_SECTION_S if args.smoke else MIN_SECTION_S
    global SMOKE_TIMING
    SMOKE_TIMING = args.smoke
    for i, name in enumerate(names):
        left = args.deadline - time.time()
        # Time an earlier section left unused goes to this one; later ones keep their caps.
        later = sum(caps[n] for n in names[i + 1 :])
        cap = min(left, max(caps[name], left - later))
        if cap < least:
            report.update(name, status="skipped", error=f"out of time ({left:.0f} s left)")
            continue
        print(f"== {name} (cap {cap:.0f} s)", flush=True)
        report.update(name, status="running", started=time.time(), cap_s=round(cap, 1))
        ctx = Context(name, args.smoke, time.time() + cap, args.work, report)
        start = time.perf_counter()
        try:
            if name in inject:
                _inject(inject[name])
            ctx.record(**(SECTIONS[name].run(ctx) or {}))
        except Exception as e:
            traceback.print_exc()
            report.error(name, "section", e)
        s = report.sections[name]
        status = "ok" if not s.get("errors") else "partial" if s.get("results") else "error"
        report.update(name, status=status, seconds=round(time.perf_counter() - start, 1))
        print(f"== {name}: {status} in {time.perf_counter() - start:.0f} s", flush=True)
        jax.clear_caches()
        _release()


def _inject(what: str) -> None:
    """Failure injection for the runner's tests (--inject NAME=raise|crash|hang)."""
    if what == "raise":
        raise RuntimeError("injected failure")
    if what == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "hang":
        time.sleep(10**6)


def supervise(names: list[str], args) -> Report:
    """Runs the sections in worker processes; a worker that dies or overruns a section's cap
    costs that section only: the next worker runs the rest."""
    report = Report.fresh(args.out, names, args)
    deadline = time.time() + args.total_seconds
    pending = list(names)
    while pending:
        cmd = [sys.executable, __file__, "--worker", "--sections", ",".join(pending)]
        cmd += ["--out", str(args.out), "--work", str(args.work), "--deadline", repr(deadline)]
        cmd += ["--smoke"] * args.smoke
        cmd += [f"--cap={c}" for c in args.cap] + [f"--inject={i}" for i in args.inject]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        worker = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            why = _watch(worker, report, deadline)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        report.reload()
        running = [n for n in pending if report.status(n) == "running"]
        waiting = [n for n in pending if report.status(n) == "pending"]
        # The section it was running failed; if it ran none (it died starting, or exited with
        # sections left), the next one is charged, so every round makes progress.
        victim = (running or waiting or [None])[0]
        if victim is not None and (running or waiting == pending):
            code = _exit(worker.returncode)
            why = why or (
                f"worker process died ({code}) during this section"
                if running
                else f"worker process ended ({code}) before this section started"
            )
            report.error(victim, "runner", why)
            report.update(victim, status="error")
            print(f"== {victim}: {why}", flush=True)
        pending = [n for n in pending if report.status(n) == "pending"]
    return report


def _watch(worker: subprocess.Popen, report: Report, deadline: float) -> str | None:
    """Waits for the worker; kills it if its section overruns its cap (plus grace) or the whole
    run its deadline. Returns why it was killed, or None if it exited by itself."""
    while worker.poll() is None:
        time.sleep(0.5)
        report.reload()
        now = time.time()
        for s in report.sections.values():
            if s["status"] != "running":
                continue
            grace = min(30.0, max(5.0, 0.3 * s["cap_s"]))
            over = now - s["started"] - s["cap_s"]
            if over > grace or now > deadline + grace:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
                return f"killed: ran {now - s['started']:.0f} s, past its cap of {s['cap_s']:.0f} s"
    return None


def _exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "device_suite")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "vidax_device_suite",
        help="random checkpoints, reused across runs (never under --out: it travels back)",
    )
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU")
    parser.add_argument("--total-seconds", type=float, default=DEFAULT_TOTAL_S)
    parser.add_argument(
        "--cap", action="append", default=[], metavar="NAME=SECONDS", help="a section's cap"
    )
    parser.add_argument("--in-process", action="store_true", help="no worker process")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--inject", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:  # before JAX starts a backend (the worker gets --smoke too)
        jax.config.update("jax_platforms", "cpu")
    if args.list:
        for s in SECTIONS.values():
            print(f"{s.name:<12} cap {s.cap_s:>4.0f} s  {(s.run.__doc__ or '').splitlines()[0]}")
        return
    names = [n for n in args.sections.split(",") if n]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        parser.error(f"unknown sections {unknown}; known: {','.join(SECTIONS)}")
    names = [n for n in SECTIONS if n in names]  # registration order
    _caps(args.cap)  # refuses a bad --cap here, not in a worker
    if args.worker:
        run_sections(names, Report(args.out), args)
        return
    if args.in_process:
        args.deadline = time.time() + args.total_seconds
        report = Report.fresh(args.out, names, args)
        run_sections(names, report, args)
    else:
        report = supervise(names, args)
    print()
    print(table(report.data))
    print(f"results: {args.out / 'results.json'}, {args.out / 'table.md'}")


if __name__ == "__main__":
    main()
