"""The `vidax` command line: generate videos, list models (more commands join as they land)."""

from __future__ import annotations

import dataclasses
import functools
import sys
import textwrap
import time
import typing
import warnings
from pathlib import Path
from typing import Annotated

import typer

from vidax.dvg.command import AccelOption, BudgetOption
from vidax.dvg.command import generate_kwargs as dvg_options
from vidax.errors import USER_ERRORS

app = typer.Typer(
    name="vidax",
    help="Video diffusion in JAX: generation, progressive sampling, sparse forcing, sharding plans.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def user_errors(fn):
    """Turns user errors into a one-line message and exit code 2, and warnings into one line
    each (`warning: ...`; random weights in bold red)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line
            try:
                return fn(*args, **kwargs)
            except USER_ERRORS as e:
                _stderr().print(
                    f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True
                )
                raise typer.Exit(2) from None

    return wrapper


def escape(text: str) -> str:
    """`text` shown as written: rich would read "[tpu]" in a message as markup and drop it."""
    from rich.markup import escape

    return escape(text)


def _stderr():
    from rich.console import Console

    return Console(stderr=True)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    from vidax.models.weights import RandomWeightsWarning

    style = "bold red" if issubclass(category, RandomWeightsWarning) else "yellow"
    _stderr().print(f"[{style}]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def report_user_errors(typer_app: typer.Typer) -> None:
    """Wraps every command of `typer_app` (and of its sub-apps) in `user_errors`."""
    for info in typer_app.registered_commands:
        info.callback = user_errors(info.callback)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            report_user_errors(group.typer_instance)


def parse_overrides(config, overrides: list[str]):
    """Applies `k=v` overrides to a frozen config dataclass, coercing to the field's type."""
    if not overrides:
        return config
    return dataclasses.replace(config, **override_changes(config, overrides))


def override_changes(config, overrides: list[str]) -> dict:
    """The typed field changes that `k=v` overrides ask of a config dataclass."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(type(config))
    changes = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(
                f"--set expects field=value with field in {sorted(fields)}, got {item!r}"
            )
        kind = hints[key]
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--set {key}: expected true/false, got {raw!r}")
            changes[key] = raw.lower() in ("true", "1")
        elif kind in (int, float, str):
            try:
                changes[key] = kind(raw)
            except ValueError:
                raise ValueError(f"--set {key}: expected {kind.__name__}, got {raw!r}") from None
        else:
            raise ValueError(f"--set cannot override {key} ({kind})")
    return changes


class _Progress:
    """A rich progress bar over denoising steps, advanced on the host as each step finishes.

    The bar appears with the first step, so an error before sampling prints no empty bar.
    """

    def __init__(self, total: int, description: str):
        from vidax.progress import step_bar

        self.progress = step_bar(_stderr())
        self.task = self.progress.add_task(description, total=total)
        self.started = False

    def step(self, i) -> None:
        self.update(int(i) + 1)

    def update(self, completed: int, total: int | None = None) -> None:
        if not self.started:
            self.progress.start()
            self.started = True
        self.progress.update(self.task, completed=completed, total=total)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.started:
            self.progress.stop()


@app.command()
def generate(
    prompt: Annotated[
        str | None, typer.Option(help="Text prompt (built-in text embedder).")
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Output: an .mp4, or an .npz of the raw float32 frames, the final latents and "
            "the initial noise (to compare with another implementation)."
        ),
    ] = Path("out.mp4"),
    fps: Annotated[
        int | None, typer.Option(help="Frame rate of the mp4 (default: the model's).")
    ] = None,
    save_frames: Annotated[
        Path | None, typer.Option(help="Also write every frame as a PNG into this folder.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model preset (see `vidax models`); default: tiny, or with --checkpoint the "
            "family its configs name (a preset then only fills in what they do not say)."
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="Diffusers-layout checkpoint: a pipeline dir (model_index.json) or transformer "
            "dir, built from its config.json files; or weights for --model's config."
        ),
    ] = None,
    vae: Annotated[
        Path | None,
        typer.Option(help="Decode with this diffusers VAE (a vae/ dir or a pipeline dir)."),
    ] = None,
    text_encoder: Annotated[
        Path | None,
        typer.Option(
            help="Text encoder instead of the checkpoint's: umT5 pipeline or text_encoder/ dir "
            "(tokenizer inside or beside it); tiny models: a text_encoder.safetensors."
        ),
    ] = None,
    prompt_embeds: Annotated[
        Path | None, typer.Option(help="Precomputed prompt embeddings (.npy / .safetensors).")
    ] = None,
    negative_prompt: Annotated[str, typer.Option(help="Negative prompt for CFG.")] = "",
    frames: Annotated[int | None, typer.Option(help="Number of frames (4k+1).")] = None,
    height: Annotated[int | None, typer.Option()] = None,
    width: Annotated[int | None, typer.Option()] = None,
    steps: Annotated[int | None, typer.Option(help="Denoising steps.")] = None,
    guidance: Annotated[float | None, typer.Option(help="Classifier-free guidance scale.")] = None,
    shift: Annotated[float | None, typer.Option(help="Flow-matching sigma shift.")] = None,
    sampler: Annotated[str | None, typer.Option(help="euler | unipc")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override the transformer config (causal models: the cache/attention "
            "config, e.g. window_frames=6; attention=dense|sparse picks the variant): "
            "field=value.",
        ),
    ] = None,
    accel: AccelOption = "none",
    budget: BudgetOption = None,
    plan: Annotated[
        Path | None, typer.Option(help="Run sharded with a plan written by `vidax plan`.")
    ] = None,
    stream: Annotated[
        bool, typer.Option(help="Causal models: write the video chunk by chunk as it is made.")
    ] = False,
    random_weights: Annotated[
        bool,
        typer.Option(
            help="Run parts without weights (see `vidax models`) on random initialisation: "
            "the output is noise (tests, timing)."
        ),
    ] = False,
    lora: Annotated[
        list[str] | None,
        typer.Option(
            "--lora",
            help="LoRA safetensors merged into the transformer (diffusers/PEFT or ComfyUI keys): "
            "FILE[:SCALE], repeatable; the scale defaults to 1.",
        ),
    ] = None,
    image: Annotated[
        Path | None,
        typer.Option(
            help="Image-to-video: the first frame (png, jpg, ...), resized to the video size. "
            "Required by i2v presets, optional for ti2v ones (see `vidax models`)."
        ),
    ] = None,
    guidance_2: Annotated[
        float | None,
        typer.Option(help="Two-expert models (Wan 2.2 A14B): the low-noise expert's guidance."),
    ] = None,
) -> None:
    """Generate a video and write it as mp4 (or .npz: raw frames, latents, initial noise)."""
    import numpy as np

    from vidax import pipeline
    from vidax.models import is_causal
    from vidax.models.lora import LoraSpec
    from vidax.models.weights import resolve_spec, with_vae
    from vidax.text import load_prompt_embeds
    from vidax.video import read_image, write_frames, write_video

    console = _stderr()
    if fps is not None and fps < 1:
        raise ValueError(f"--fps must be >= 1, got {fps}")
    if out.suffix not in (".mp4", ".npz"):
        raise ValueError(f"--out must end in .mp4 or .npz, got {out.name!r}")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if model is None and (checkpoint is None or not _has_configs(checkpoint)):
        model = "tiny"  # the default preset; a checkpoint with configs names its own family
    if model is not None and is_causal(model):
        ignored = {
            "--accel": accel != "none",
            "--budget": budget is not None,
            "--steps": steps is not None,
            "--guidance": guidance is not None,
            "--shift": shift is not None,
            "--sampler": sampler is not None,
            "--negative-prompt": negative_prompt != "",
            "--checkpoint": checkpoint is not None,
            "--vae": vae is not None,
            "--text-encoder": text_encoder is not None,
            "--prompt-embeds": prompt_embeds is not None,
            "--plan": plan is not None,
            "--fps": fps is not None,
            "--save-frames": save_frames is not None,
            "--out *.npz": out.suffix == ".npz",
            "--lora": bool(lora),
            "--image": image is not None,
            "--guidance-2": guidance_2 is not None,
        }
        given = [flag for flag, used in ignored.items() if used]
        if given:
            raise ValueError(
                f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to the "
                f"causal model {model!r}: it streams chunk by chunk with its own few-step "
                "schedule and shipped weights, without classifier-free guidance (--set edits "
                "its ForcingConfig)"
            )
    if stream:
        _stream(model, prompt, out, frames, height, width, seed, set_, random_weights)
        return
    if model is not None and is_causal(model):
        _stream(model, prompt, out, frames, height, width, seed, set_, random_weights)
        return
    accel_options = dvg_options(accel, budget)
    loras = [LoraSpec.parse(text) for text in lora or ()]
    for item in loras:  # before anything loads
        if not item.path.is_file():
            raise FileNotFoundError(f"LoRA not found: {item.path}")
        console.print(f"LoRA {item.path.name} x{item.scale:g}", highlight=False)
    if checkpoint is not None and not checkpoint.exists():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    first_frame = None if image is None else read_image(image)
    spec = resolve_spec(model, checkpoint)
    if vae is not None:
        spec = with_vae(spec, vae)
    if set_:
        spec = dataclasses.replace(spec, config=parse_overrides(spec.config, set_))
    if checkpoint is not None and _has_configs(checkpoint):
        console.print(_describe(spec), highlight=False, soft_wrap=True)
    embeds = negative = None
    if prompt_embeds is not None:
        embeds, negative = load_prompt_embeds(prompt_embeds, spec)
    elif prompt is None:
        raise ValueError("give --prompt or --prompt-embeds")
    else:
        _note_reading(spec, prompt)
    mesh = strategy = None
    if plan is not None:
        from vidax.planner.command import load_plan

        mesh, strategy = load_plan(plan)
    n_steps = spec.defaults.steps if steps is None else steps
    start = time.perf_counter()
    with _Progress(n_steps, f"denoising ({spec.name})") as bar:
        video = pipeline.generate(
            spec,
            prompt=prompt if embeds is None else None,
            prompt_embeds=embeds,
            negative_prompt=negative_prompt,
            negative_prompt_embeds=negative,
            num_frames=frames,
            height=height,
            width=width,
            steps=n_steps,
            guidance=guidance,
            shift=shift,
            sampler=sampler,
            seed=seed,
            checkpoint=checkpoint,
            text_encoder=text_encoder,
            mesh=mesh,
            strategy=strategy,
            on_step=bar.step,
            random_weights=random_weights,
            lora=loras,
            image=first_frame,
            guidance_2=guidance_2,
            **accel_options,
        )
    if video.frames is None:
        raise ValueError(f"model {spec.name!r} has no VAE to decode frames")
    for choice in video.choices or []:
        measured = ""
        if accel.startswith("dvg"):
            measured = (
                f" for motion {choice.signals[0]:.2f}, detail {choice.signals[1]:.2f}"
                if choice.signals is not None
                else " (no probe: the same for any content at this budget)"
            )
        console.print(
            f"accel {accel}: chose {choice.family} {choice.schedule.describe()}{measured}, "
            f"{choice.cost:.2f} of the full sampler's token-steps; denoising "
            f"{video.denoise_seconds:.1f}s",
            highlight=False,
            soft_wrap=True,
        )
    if video.step_cache is not None:
        c = video.step_cache
        console.print(
            f"accel {accel}: step cache skipped {c.skipped} of {c.steps} model forwards"
            + (
                f" (calibrated now: a full run, kept in {c.calibration}; later runs skip steps)"
                if c.calibrating
                else ""
            )
            + f"; denoising {video.denoise_seconds:.1f}s",
            highlight=False,
            soft_wrap=True,
        )
    frames_out = video.frames if video.frames.ndim == 4 else video.frames[0]
    if out.suffix == ".npz":
        np.savez(out, frames=video.frames, latents=video.latents, noise=video.noise)
    else:
        write_video(out, frames_out, fps or video.fps)
    if save_frames is not None:
        write_frames(save_frames, frames_out)
    console.print(
        f"wrote {out} ({frames_out.shape[0]} frames, {frames_out.shape[2]}x{frames_out.shape[1]}, "
        f"{time.perf_counter() - start:.1f}s)"
    )


def _has_configs(checkpoint: Path) -> bool:
    from vidax.models.pretrained import is_config_dir

    return checkpoint.is_dir() and is_config_dir(checkpoint)


def _describe(spec) -> str:
    """One line saying what a checkpoint's configs built."""
    c, d = spec.config, spec.defaults
    params = spec.num_params() / 1e6
    return (
        f"{spec.name}: {spec.family} transformer ({params:.1f}M parameters, {c.num_layers} "
        f"layers, {c.param_dtype}){_experts(spec)}, VAE {spec.vae_name}, sampler {d.sampler} "
        f"shift {d.shift:g}{'' if spec.task == 't2v' else f', {spec.task}'}"
    )


def _experts(spec) -> str:
    if spec.boundary_ratio is None:
        return ""
    return f" x2 experts (switch at t={spec.boundary_ratio * 1000:g})"


def _note_reading(spec, prompt: str) -> None:
    """Says how a model trained on one caption grammar reads the prompt, when it rewrites it."""
    from vidax.data import read_prompt

    if (read := read_prompt(spec, prompt)) != prompt:
        _stderr().print(f"prompt read as: {read!r}", highlight=False, soft_wrap=True)


def _stream(model, prompt, out, frames, height, width, seed, set_, random_weights) -> None:
    """`vidax generate` for causal (autoregressive) models; `--set` edits the `ForcingConfig`."""
    from vidax.forcing.command import stream_generate
    from vidax.models import get_causal, is_causal

    if not is_causal(model):
        raise ValueError(f"--stream needs a causal model (e.g. tiny-causal), not {model!r}")
    if prompt is None:
        raise ValueError("give --prompt")
    # `--set attention=dense|sparse` picks the variant (its cache config and its weights); the
    # other `--set` fields then edit that variant's config.
    chosen = [
        item.partition("=")[2].strip() for item in set_ or [] if item.startswith("attention=")
    ]
    attention = chosen[-1] if chosen else "sparse"
    preset = get_causal(model)
    _note_reading(preset.spec, prompt)
    rest = [item for item in set_ or [] if not item.startswith("attention=")]
    overrides = override_changes(preset.forcing(attention), rest)
    start = time.perf_counter()
    with _Progress(1, f"streaming chunks ({model} is causal)") as bar:

        def on_chunk(done: int, total: int, written: int) -> None:
            bar.update(done, total)

        result = stream_generate(
            model,
            prompt,
            out,
            frames=frames,
            height=height,
            width=width,
            seed=seed,
            attention=attention,
            forcing_overrides=overrides or None,
            on_chunk=on_chunk,
            random_weights=random_weights,
        )
    _stderr().print(
        f"wrote {result.path} ({result.frames} frames in {result.chunks} chunks, "
        f"{time.perf_counter() - start:.1f}s)"
    )


@app.command("models")
def list_models() -> None:
    """List model presets (causal ones too): sizes, parts, and whether weights ship with vidax."""
    from vidax import models
    from vidax.models.weights import missing_weights

    rows = []
    for name in models.names():
        if models.is_causal(name):
            preset = models.get_causal(name)
            spec, family, frames = preset.spec, f"{preset.spec.family} causal", preset.num_frames
            shipped = all(preset.weights_path(a) for a in ("dense", "sparse")) and not (
                missing_weights(spec, transformer=False)
            )
        else:
            spec = models.get(name)
            family, frames = spec.family, spec.defaults.num_frames
            shipped = not missing_weights(spec, image_encoder=True)
        d = spec.defaults
        rows.append(
            (
                (
                    name,
                    _human(spec.num_params()),
                    f"{frames}x{d.height}x{d.width}",
                    "shipped" if shipped else "needs --checkpoint",
                ),
                f"{family} DiT{_experts(spec)}, {spec.task}, VAE {spec.vae_name}, text "
                f"encoder {spec.text_encoder}"
                + (f", image encoder {spec.image_encoder}" if spec.image_encoder else ""),
            )
        )
    # Plain text, a line a preset and its parts below it, indented (wrapped where long):
    # nothing is cut, and every line fits 80 columns.
    header = ("preset", "params", "frames x h x w", "weights")
    widths = [max(len(r[0][i]) for r in [(header, ""), *rows]) for i in range(len(header))]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    typer.echo(line(header))
    for cells, parts in rows:
        typer.echo(line(cells))
        typer.echo(textwrap.fill(parts, 80, initial_indent="    ", subsequent_indent="      "))


def _human(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


@app.callback()
def _options(
    ctx: typer.Context,
    compile_cache: Annotated[
        bool,
        typer.Option(
            "--compile-cache/--no-compile-cache",
            help="Keep compiled programs across runs (jax's persistent cache in "
            "$VIDAX_CACHE_DIR or ~/.cache/vidax/jax; VIDAX_COMPILE_CACHE=0 turns it off).",
        ),
    ] = True,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", help="Show the accelerator runtime's start-up log lines."),
    ] = False,
) -> None:
    """Video diffusion in JAX: generation, progressive sampling, sparse forcing, sharding plans."""
    from vidax import compile_cache as cache
    from vidax import runtime

    runtime.set_verbose(verbose)
    # The planner keeps its own cache of compiled candidates: jax's cannot reload executables
    # compiled for a compile-only TPU topology (it warns on every hit).
    if compile_cache and cache.enabled_by_environment() and ctx.invoked_subcommand != "plan":
        cache.enable()
    runtime.start_backends()


def _register_subcommands() -> None:
    """Commands implemented beside their subsystems (each keeps heavy imports lazy)."""
    from vidax.eval.command import register as register_eval
    from vidax.forcing.train_command import register as register_causal
    from vidax.planner.command import register as register_plan
    from vidax.serve.command import register as register_serve
    from vidax.train.command import register as register_train

    register_plan(app)
    register_serve(app)
    register_causal(register_train(app))
    register_eval(app)
    report_user_errors(app)


_register_subcommands()


def main() -> None:  # pragma: no cover
    sys.exit(app())
