"""What a client may ask `vidax serve` for, validated with the command line's one-line errors.

`parse` turns a request's JSON body into a `VideoRequest` or raises a ValueError whose message
is the one `vidax generate` prints for the same mistake (frames not 4k+1, an unknown model, a
budget outside (0, 1], ...), so the page, the API and the CLI say the same thing. Nothing is
loaded: only presets, geometry and the cache layout are read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from vidax import models
from vidax.dvg.command import generate_kwargs
from vidax.forcing import command as forcing_command
from vidax.models.weights import TRANSFORMER, missing_message, missing_weights

# frames x height x width of one video; the tiny models' default sizes fit many times over.
DEFAULT_MAX_PIXELS = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class VideoRequest:
    """One video to generate, with every default filled in.

    steps: None for causal models (their own few-step schedule per chunk).
    """

    prompt: str
    model: str
    frames: int
    height: int
    width: int
    steps: int | None
    seed: int
    accel: str
    budget: float | None
    causal: bool

    def settings(self) -> dict:
        return dataclasses.asdict(self)


_TYPES: dict[str, tuple[type, ...]] = {
    "prompt": (str,),
    "model": (str,),
    "frames": (int,),
    "height": (int,),
    "width": (int,),
    "steps": (int,),
    "seed": (int,),
    "accel": (str,),
    "budget": (int, float),
}


_NOUNS = {int: "an integer", str: "a string"}

T = TypeVar("T")


def _field(body: dict[str, Any], key: str, default: T) -> T:
    """`body[key]` (its type checked against `_TYPES` already), or `default` if absent or null."""
    value = body.get(key)
    return default if value is None else value


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """A preset the server can run (its weights ship with vidax) and its defaults."""

    name: str
    causal: bool
    frames: int
    height: int
    width: int
    steps: int | None
    fps: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def available_models() -> list[ModelInfo]:
    """The presets whose weights are all there (`vidax models` says "shipped"), sorted."""
    out = []
    for name in models.names():
        if models.is_causal(name):
            preset = models.get_causal(name)
            spec, frames, steps = preset.spec, preset.num_frames, None
            shipped = all(preset.weights_path(a) for a in ("dense", "sparse")) and not (
                missing_weights(spec, transformer=False)
            )
        else:
            spec = models.get(name)
            frames, steps = spec.defaults.num_frames, spec.defaults.steps
            shipped = not missing_weights(spec)
        if shipped:
            d = spec.defaults
            out.append(
                ModelInfo(name, models.is_causal(name), frames, d.height, d.width, steps, d.fps)
            )
    return out


def parse(
    body: object,
    *,
    available: Sequence[str],
    default_model: str = "tiny",
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> VideoRequest:
    """The `VideoRequest` a JSON body asks for.

    Args:
      body: the decoded JSON (fields: prompt, model, frames, height, width, steps, seed, accel,
        budget; all but prompt optional).
      available: model presets this server runs.
      default_model: the model when the body names none.
      max_pixels: the largest frames x height x width accepted.

    Raises:
      ValueError: a one-line reason, the command line's where it has one.
    """
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    unknown = sorted(set(body) - set(_TYPES))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; fields: {', '.join(_TYPES)}")
    for key, value in body.items():
        kinds = _TYPES[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            expected = "a number" if float in kinds else _NOUNS[kinds[0]]
            raise ValueError(f"{key} must be {expected}, got {value!r}")
    get = body.get
    prompt = get("prompt")
    if not prompt:
        raise ValueError("give --prompt")
    model = get("model") or default_model
    causal = models.is_causal(model)
    if causal:
        spec, default_frames = models.get_causal(model).spec, models.get_causal(model).num_frames
    else:
        spec = models.get(model)  # "unknown model 'x'; known models: ..."
        default_frames = spec.defaults.num_frames
    if model not in available:
        missing = missing_weights(spec) or [TRANSFORMER]
        raise ValueError(missing_message(spec, missing))
    d = spec.defaults
    frames = _field(body, "frames", default_frames)
    height = _field(body, "height", d.height)
    width = _field(body, "width", d.width)
    accel = get("accel") or "none"
    given_budget = get("budget")
    budget = None if given_budget is None else float(given_budget)
    steps = get("steps")
    if causal:
        given = [
            flag
            for flag, used in (
                ("--accel", accel != "none"),
                ("--budget", budget is not None),
                ("--steps", steps is not None),
            )
            if used
        ]
        if given:
            raise ValueError(
                f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to the "
                f"causal model {model!r}: it streams chunk by chunk with its own few-step "
                "schedule and shipped weights, without classifier-free guidance"
            )
        forcing_command.check(model, frames=frames, height=height, width=width)
    else:
        if steps is not None and steps < 1:
            raise ValueError(f"--steps must be >= 1, got {steps}")
        steps = d.steps if steps is None else steps
        chosen = generate_kwargs(accel, budget)  # "--budget must be in (0, 1], got 2.0"
        budget = chosen["budget"] if accel != "none" else None
        spec.geometry().latent_shape(frames, height, width)
    if frames * height * width > max_pixels:
        raise ValueError(
            f"{frames} frames of {height}x{width} are {frames * height * width} pixels, over "
            f"this server's --max-pixels {max_pixels}"
        )
    return VideoRequest(
        prompt=prompt,
        model=model,
        frames=frames,
        height=height,
        width=width,
        steps=steps,
        seed=get("seed") or 0,
        accel=accel,
        budget=budget,
        causal=causal,
    )
