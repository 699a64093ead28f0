"""Model specs read from a diffusers checkpoint's own configs; a preset is only a default.

A diffusers pipeline folder says what it is: `model_index.json` names the pipeline class and
its components, each component folder has a `config.json` (transformer, VAE, text encoder) or
a `scheduler_config.json`. `spec_from_checkpoint` turns those into a `ModelSpec`: the
transformer architecture, the VAE (with where its weights are), the text encoder, and the
sampler and shift of the pipeline's scheduler. What the checkpoint does not say (the text length
the pipeline pads to, the default video size) comes from the base preset: the `--model` given,
else the family's flagship. Anything the files say that vidax does not implement is an error
naming it, never ignored.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from vidax.checkpoint import CheckpointError, open_checkpoint
from vidax.models.registry import FAMILIES, VAE_FAMILIES, ModelSpec, VAESpec, get

# diffusers class name -> vidax family.
PIPELINES = {
    "WanPipeline": "wan",
    "WanImageToVideoPipeline": "wan",
    "HunyuanVideoPipeline": "hunyuanvideo",
    "HunyuanVideo15Pipeline": "hunyuanvideo15",
    "HunyuanVideo15ImageToVideoPipeline": "hunyuanvideo15",
}
TRANSFORMERS = {
    "WanTransformer3DModel": "wan",
    "HunyuanVideoTransformer3DModel": "hunyuanvideo",
    "HunyuanVideo15Transformer3DModel": "hunyuanvideo15",
}
VAES = {
    "AutoencoderKLWan": "wan",
    "AutoencoderKLHunyuanVideo": "hunyuan",
    "AutoencoderKLHunyuanVideo15": "hunyuan15",
}
# The preset whose defaults (text length, video size) a checkpoint of each family starts from.
DEFAULT_PRESET = {
    "wan": "wan2.1-1.3b",
    "hunyuanvideo": "hunyuanvideo",
    "hunyuanvideo15": "hunyuanvideo1.5",
}
# Known diffusers pipelines vidax does not run yet: a clear error instead of a wrong model.
NOT_SUPPORTED = {
    "WanVACEPipeline": "Wan VACE",
    "WanVideoToVideoPipeline": "Wan video-to-video",
    "WanAnimatePipeline": "Wan Animate",
    "HunyuanVideoImageToVideoPipeline": "HunyuanVideo image-to-video",
    "HunyuanSkyreelsImageToVideoPipeline": "SkyReels image-to-video",
    "HunyuanVideoFramepackPipeline": "HunyuanVideo FramePack",
}
# The image-encoder preset a pipeline's `image_encoder` class (model_index.json) stands for:
# its name in the spec (`load_image_encoder` builds the encoder from image_encoder/config.json).
IMAGE_ENCODERS = {
    "CLIPVisionModel": "clip-vit-h-14",
    "CLIPVisionModelWithProjection": "clip-vit-h-14",
    "SiglipVisionModel": "siglip-so400m-patch14-384",
}
# Families whose pipelines give the scheduler sigmas = linspace(1, 0, N+1)[:-1] instead of
# letting it space its own (`vidax.sampling.FlowEuler.linspace_sigmas`).
LINSPACE_SIGMAS = {"hunyuanvideo", "hunyuanvideo15"}


def read_config(path: Path) -> dict[str, Any]:
    """A JSON config file as a dict; a one-line error if it is missing or unreadable."""
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint config not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def _component_config(
    folder: Path, classes: dict[str, str], what: str
) -> tuple[dict[str, Any], str]:
    """A component folder's `config.json` and its `_class_name`, which must be in `classes`.

    Raises:
      CheckpointError: the config is missing or unreadable, or names another class (`what`
        says what the folder should hold, e.g. "a VAE").
    """
    config = read_config(folder / "config.json")
    name = config.get("_class_name")
    if name not in classes:
        raise CheckpointError(
            f"{folder / 'config.json'}: _class_name {name!r} is not {what} vidax runs "
            f"({', '.join(classes)})"
        )
    return config, name


def is_config_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a diffusers pipeline or component folder (has its own config)."""
    path = Path(path)
    return (path / "model_index.json").is_file() or (path / "config.json").is_file()


def spec_from_checkpoint(path: str | os.PathLike, base: ModelSpec | None = None) -> ModelSpec:
    """The spec of the diffusers checkpoint at `path`, built from its configs.

    Args:
      path: a pipeline folder (`model_index.json`), a transformer folder (`config.json`), or a
        weights file / sharded index (no config: `base` is used as it is).
      base: the preset giving what the checkpoint does not say; default: the family's
        `DEFAULT_PRESET`. Must be of the checkpoint's family.

    Raises:
      FileNotFoundError: `path` does not exist.
      CheckpointError: unreadable configs, or a pipeline/component vidax does not run.
      ValueError: the checkpoint's family differs from `base`'s, or unsupported options.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not path.is_dir() or not is_config_dir(path):
        if base is None:
            raise CheckpointError(f"{path} has no config.json / model_index.json: pass --model")
        return base
    pipeline_dir = None
    options: dict[str, Any] = {}
    if (path / "model_index.json").is_file():
        pipeline_dir, transformer_dir = path, path / "transformer"
        family = _pipeline_family(path)
        options = _pipeline_options(read_config(path / "model_index.json"))
    else:
        transformer_dir = path
        family = None
    config, name = _component_config(transformer_dir, TRANSFORMERS, "a transformer")
    family = family or TRANSFORMERS[name]
    if TRANSFORMERS[name] != family:
        raise CheckpointError(f"{path}: a {name} in a {family} pipeline")
    if base is None:
        base = get(DEFAULT_PRESET[family])
    elif base.family != family:
        raise ValueError(
            f"checkpoint {path} holds a {family} transformer but model {base.name!r} is a "
            f"{base.family} model: pass a {family} preset, or no --model"
        )
    overrides = {"expand_timesteps": True} if options.pop("expand_timesteps", False) else {}
    spec = dataclasses.replace(
        base,
        name=path.name or str(path),
        config=_transformer_config(family, config, transformer_dir, base, **overrides),
        weights=None,
        **options,
    )
    if pipeline_dir is None:
        return spec
    return _with_pipeline_parts(spec, pipeline_dir)


def read_vae(path: str | os.PathLike) -> VAESpec:
    """The VAE of a diffusers VAE folder (`config.json` + weights) or of a pipeline folder's
    `vae/`, with `path` set to where its weights are.

    Raises:
      FileNotFoundError: `path` does not exist.
      CheckpointError: no config, or a VAE class vidax does not run.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"VAE not found: {path}")
    if (path / "vae" / "config.json").is_file():
        path = path / "vae"
    config, name = _component_config(path, VAES, "a VAE")
    family = VAES[name]
    module = VAE_FAMILIES[family].module
    return VAESpec(
        name=f"{name} from {path}",
        family=family,
        config=module.from_diffusers_config(config),
        path=path,
    )


def _pipeline_family(path: Path) -> str:
    index = read_config(path / "model_index.json")
    name = index.get("_class_name")
    if name in NOT_SUPPORTED:
        raise CheckpointError(f"{path}: {NOT_SUPPORTED[name]} ({name}) is not supported yet")
    if name not in PIPELINES:
        raise CheckpointError(
            f"{path / 'model_index.json'}: pipeline {name!r} is not one vidax runs "
            f"({', '.join(PIPELINES)})"
        )
    two = _present(index.get("transformer_2")) or (path / "transformer_2").is_dir()
    if two and not index.get("boundary_ratio"):
        raise CheckpointError(
            f"{path}: a second transformer without boundary_ratio (when to switch to it)"
        )
    if not (path / "transformer").is_dir():
        raise CheckpointError(f"{path}: pipeline folder without transformer/")
    return PIPELINES[name]


def _pipeline_options(index: dict[str, Any]) -> dict[str, Any]:
    """`ModelSpec` fields a pipeline's model_index.json sets: its task (image-to-video
    pipelines; Wan 2.2 TI2V's `expand_timesteps` does both), image encoder (by its class:
    `IMAGE_ENCODERS`), two experts' boundary; `expand_timesteps` for the transformer config.

    Raises:
      CheckpointError: an image encoder class vidax does not run.
    """
    name = index.get("_class_name", "")
    expand = bool(index.get("expand_timesteps"))
    task = "ti2v" if expand else ("i2v" if "ImageToVideo" in name else "t2v")
    ratio = index.get("boundary_ratio")
    entry = index.get("image_encoder")
    image_encoder = None
    if isinstance(entry, list) and _present(entry):
        encoder_class = entry[-1]  # [library, class]
        if encoder_class not in IMAGE_ENCODERS:
            raise CheckpointError(
                f"image encoder {encoder_class!r} is not one vidax runs "
                f"({', '.join(IMAGE_ENCODERS)})"
            )
        image_encoder = IMAGE_ENCODERS[encoder_class]
    return {
        "task": task,
        "image_encoder": image_encoder,
        "boundary_ratio": None if ratio is None else float(ratio),
        "expand_timesteps": expand,
    }


def _present(entry) -> bool:
    # model_index.json lists a component as [library, class], or [null, null] when absent.
    return isinstance(entry, list) and any(e is not None for e in entry)


def _transformer_config(family: str, config: dict, folder: Path, base: ModelSpec, **pipeline):
    """The family's config from the transformer's config.json; the pipeline-level lengths and
    the attention implementation from `base`, the numerics from the stored weights, and what
    the pipeline says (`pipeline`, e.g. Wan's expand_timesteps)."""
    module = FAMILIES[family].module
    keep = {"text_len", "byt5_len", "image_len", "attention_impl", "remat"}
    overrides = {k: getattr(base.config, k) for k in keep if hasattr(base.config, k)}
    overrides.update(pipeline)
    dtype = _stored_dtype(folder)
    if dtype is not None:  # run as stored, as diffusers does once loaded in that dtype
        overrides.update(dtype=dtype, param_dtype=dtype)
    return module.from_diffusers_config(config, **overrides)


def _stored_dtype(folder: Path) -> str | None:
    """The floating dtype of the weights in `folder` (None: no weights, or mixed)."""
    try:
        reader = open_checkpoint(folder)
    except CheckpointError:
        return None  # the loader reports missing weights with its own message
    names = {str(reader.dtype(k)) for k in reader}
    names &= {"float32", "bfloat16", "float16"}
    return names.pop() if len(names) == 1 else None


def _with_pipeline_parts(spec: ModelSpec, root: Path) -> ModelSpec:
    """`spec` with the VAE, scheduler and guider of the pipeline at `root` (its text encoder is
    read where prompts are embedded)."""
    changes: dict[str, Any] = {}
    if (root / "vae" / "config.json").is_file():
        changes["vae"] = read_vae(root / "vae")
    defaults = spec.defaults
    scheduler = root / "scheduler" / "scheduler_config.json"
    if scheduler.is_file():
        solver = solver_from_diffusers(read_config(scheduler))
        if spec.family in LINSPACE_SIGMAS:
            if solver["sampler"] != "euler":
                raise CheckpointError(
                    f"{scheduler}: vidax runs {spec.family} pipelines with the flow-matching "
                    "Euler scheduler only"
                )
            solver["solver_options"] = (("linspace_sigmas", True),)
        defaults = dataclasses.replace(defaults, **solver)
    guider = root / "guider" / "guider_config.json"
    if guider.is_file():
        scale = read_config(guider).get("guidance_scale")
        if scale is not None:
            defaults = dataclasses.replace(defaults, guidance=float(scale))
    return dataclasses.replace(spec, defaults=defaults, **changes)


# Scheduler options and the only values vidax's solvers implement.
_EULER_FIXED: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "use_dynamic_shifting": False,
    "invert_sigmas": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "stochastic_sampling": False,
}
# Read only with dynamic shifting (which is refused above).
_EULER_UNUSED = {
    "base_shift",
    "max_shift",
    "base_image_seq_len",
    "max_image_seq_len",
    "time_shift_type",
}
_UNIPC_FIXED: dict[str, Any] = {
    **{k: v for k, v in _EULER_FIXED.items() if k.startswith("use_") or k == "num_train_timesteps"},
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "thresholding": False,
    "predict_x0": True,
    "disable_corrector": [],
    "solver_p": None,
    "timestep_spacing": "linspace",
    "steps_offset": 0,
    "final_sigmas_type": "zero",
    "rescale_betas_zero_snr": False,
    "sigma_min": None,
    "sigma_max": None,
    "shift_terminal": None,
}
# Beta-schedule and thresholding parameters: unused with flow sigmas and no thresholding.
_UNIPC_UNUSED = {
    "beta_start",
    "beta_end",
    "beta_schedule",
    "trained_betas",
    "dynamic_thresholding_ratio",
    "sample_max_value",
    "time_shift_type",
}


def solver_from_diffusers(config: dict) -> dict[str, Any]:
    """`SamplingDefaults` fields (sampler, shift, solver_options) of a diffusers scheduler
    config (`scheduler_config.json` as a dict).

    Raises:
      CheckpointError: another scheduler class, or an option vidax's solvers do not implement.
    """
    name = config.get("_class_name")
    if name == "FlowMatchEulerDiscreteScheduler":
        _check_scheduler(name, config, _EULER_FIXED, {"shift"} | _EULER_UNUSED)
        return dict(sampler="euler", shift=float(config.get("shift", 1.0)), solver_options=())
    if name == "UniPCMultistepScheduler":
        options = {"solver_order", "solver_type", "lower_order_final", "flow_shift"}
        _check_scheduler(name, config, _UNIPC_FIXED, options | _UNIPC_UNUSED)
        solver_options = (
            ("order", int(config.get("solver_order", 2))),
            ("solver_type", config.get("solver_type", "bh2")),
            ("lower_order_final", bool(config.get("lower_order_final", True))),
        )
        return dict(
            sampler="unipc",
            shift=float(config.get("flow_shift", 1.0)),
            solver_options=solver_options,
        )
    raise CheckpointError(
        f"scheduler {name!r} is not supported (FlowMatchEulerDiscreteScheduler or "
        "UniPCMultistepScheduler with flow sigmas)"
    )


def _check_scheduler(name: str, config: dict, fixed: dict, known: set[str]) -> None:
    for key, value in fixed.items():
        if key in config and config[key] != value:
            raise CheckpointError(f"{name} with {key}={config[key]!r} is not supported")
    unknown = sorted(k for k in config if not k.startswith("_") and k not in {*fixed, *known})
    if unknown:
        raise CheckpointError(f"unknown {name} config keys {unknown}")
