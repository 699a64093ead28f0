"""Where a preset's weights come from: a checkpoint, the weights shipped with vidax, or (only
when asked) random initialisation.

Nothing runs on weights nobody asked for: a part without weights is a `CheckpointError` naming
every missing part, unless `random_weights=True` (`--random-weights`) asks for random
initialisation, which then warns once (`RandomWeightsWarning`).

    spec = vidax.models.get("tiny")
    transformer = spec.load()              # load_transformer(spec, None)
    vae = spec.load_vae()                  # load_vae(spec, None)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import warnings
from pathlib import Path

import jax
from flax import nnx

from vidax.checkpoint import CheckpointError
from vidax.models import pretrained, word_encoder
from vidax.models.dit_stages import VideoDiT
from vidax.models.registry import (
    ASSETS,
    IMAGE_ENCODER_FAMILIES,
    ModelSpec,
    get,
    image_encoder_family,
)
from vidax.sharding import param_shardings

# The parts of a preset that need weights, as `missing_weights` names them.
TRANSFORMER, VAE, TEXT_ENCODER = "transformer", "VAE", "text encoder"
TRANSFORMER_2, IMAGE_ENCODER = "second transformer", "image encoder"
# A trained `WordEncoder`'s weights, beside the transformer's.
TEXT_ENCODER_FILE = "text_encoder.safetensors"


class RandomWeightsWarning(UserWarning):
    """A part of a model runs on random initialisation because the caller asked for it."""


def resolve_spec(
    model: str | ModelSpec | None, checkpoint: str | os.PathLike | None = None
) -> ModelSpec:
    """The spec to run: a `ModelSpec` as it is; a preset name (or None) read through the
    checkpoint's own configs when it has them, else the preset.

    Raises:
      ValueError: no model and no checkpoint with configs, or a checkpoint of another family.
    """
    if isinstance(model, ModelSpec):
        return model
    base = None if model is None else get(model)
    if checkpoint is not None and (base is None or pretrained.is_config_dir(checkpoint)):
        return pretrained.spec_from_checkpoint(checkpoint, base)
    if base is None:
        raise ValueError("name a model preset, or pass a checkpoint folder with its configs")
    return base


def with_vae(spec: ModelSpec, path: str | os.PathLike) -> ModelSpec:
    """`spec` decoding with the diffusers VAE at `path` (a VAE folder or a pipeline folder);
    its latent channels must fit the transformer (checked by `ModelSpec.geometry`)."""
    spec = dataclasses.replace(spec, vae=pretrained.read_vae(path))
    spec.geometry()
    return spec


def missing_weights(
    spec: ModelSpec,
    checkpoint: str | os.PathLike | None = None,
    *,
    transformer: bool = True,
    vae: bool = True,
    text_encoder: bool = True,
    image_encoder: bool = False,
) -> list[str]:
    """The parts of `spec` (among those asked about) with no weights in `checkpoint` or shipped.

    Returns:
      A sublist of [TRANSFORMER, TRANSFORMER_2, VAE, TEXT_ENCODER, IMAGE_ENCODER]; a
      transformer counts as present whenever a checkpoint is given (its loader reports what the
      checkpoint lacks), the second one (two-expert models) when it has `transformer_2/`.

    Raises:
      FileNotFoundError: `checkpoint` does not exist.
    """
    root = None
    if checkpoint is not None:
        root = Path(checkpoint)
        if not root.exists():
            raise FileNotFoundError(f"checkpoint not found: {root}")
    missing = []
    if transformer and root is None and shipped(spec, "transformer.safetensors") is None:
        missing.append(TRANSFORMER)
    if transformer and spec.boundary_ratio is not None and _transformer_2_path(root) is None:
        missing.append(TRANSFORMER_2)
    if vae and spec.vae is not None and _vae_path(spec, root) is None:
        missing.append(VAE)
    if text_encoder and not _has_text_encoder(spec, root):
        missing.append(TEXT_ENCODER)
    if image_encoder and spec.image_encoder is not None and _image_encoder_path(root) is None:
        missing.append(IMAGE_ENCODER)
    return missing


def _transformer_2_path(root: Path | None) -> Path | None:
    return (
        root / "transformer_2" if root is not None and (root / "transformer_2").is_dir() else None
    )


def _image_encoder_path(root: Path | None) -> Path | None:
    return (
        root / "image_encoder" if root is not None and (root / "image_encoder").is_dir() else None
    )


def _has_text_encoder(spec: ModelSpec, root: Path | None) -> bool:
    if spec.text_encoder == "hashed":  # built in; a trained WordEncoder on top needs weights
        return spec.text_config is None or _text_encoder_path(spec, root) is not None
    if spec.text_encoder.startswith("umt5"):
        return root is not None and (root / "text_encoder").is_dir()
    return False  # not ported: only precomputed embeddings


def missing_message(spec: ModelSpec, missing: list[str]) -> str:
    """One line naming what `spec` has no weights for, and the ways out (random weights can
    stand in for the transformer, the VAE and a trained `WordEncoder`, not for umT5 or LLaVA)."""
    real_text = TEXT_ENCODER in missing and spec.text_encoder != "hashed"
    names = {
        TRANSFORMER: "transformer",
        TRANSFORMER_2: "second (low-noise) transformer (transformer_2/)",
        IMAGE_ENCODER: f"image encoder ({spec.image_encoder}, image_encoder/)",
        VAE: f"VAE ({spec.vae_name})",
        TEXT_ENCODER: f"text encoder ({spec.text_encoder if real_text else 'WordEncoder'})",
    }
    parts = [names[m] for m in missing]
    what = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    fix = "pass --checkpoint DIR"
    if real_text and spec.text_encoder.startswith("umt5"):
        fix += " (with text_encoder/ and tokenizer/ for the text encoder) or --prompt-embeds"
    elif real_text:
        fix = "pass --prompt-embeds (vidax does not run this text encoder)"
        fix += " and --checkpoint DIR" if len(missing) > 1 else ""
    if any(m != TEXT_ENCODER or not real_text for m in missing):
        fix += ", or --random-weights to run on random weights (the output is noise)"
    return f"model {spec.name!r} has no weights for its {what}: {fix}"


def warn_random(spec: ModelSpec, parts: list[str]) -> None:
    """The one `RandomWeightsWarning` for `parts` of `spec` running on random weights."""
    warnings.warn(
        RandomWeightsWarning(
            f"RANDOM WEIGHTS (--random-weights): {spec.name!r} runs its {', '.join(parts)} on "
            "random initialisation; the output is noise"
        ),
        stacklevel=3,
    )


def load_transformer(
    spec: ModelSpec,
    checkpoint: str | os.PathLike | None,
    *,
    mesh=None,
    strategy=None,
    random_weights: bool = False,
) -> VideoDiT:
    """The spec's DiT from `checkpoint` (diffusers layout: a pipeline dir with `transformer/`, a
    transformer dir, index or file), or its shipped weights, or (only with `random_weights`,
    warning) random weights.

    Raises:
      FileNotFoundError: `checkpoint` does not exist.
      CheckpointError: no weights and not `random_weights`, or a checkpoint that does not fit.
    """
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        if (path / "transformer").is_dir():
            path = path / "transformer"
        return spec.loader(path, spec.config, mesh=mesh, strategy=strategy)
    weights = shipped(spec, "transformer.safetensors")
    if weights is not None:
        return spec.loader(weights, spec.config, mesh=mesh, strategy=strategy)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [TRANSFORMER]))
    warn_random(spec, [TRANSFORMER])
    return random_transformer(spec, mesh, strategy)


def load_transformer_2(
    spec: ModelSpec,
    checkpoint: str | os.PathLike | None,
    *,
    mesh=None,
    strategy=None,
    random_weights: bool = False,
) -> VideoDiT | None:
    """A two-expert model's second (low-noise) transformer from `<checkpoint>/transformer_2`
    (same config as the first), or (only with `random_weights`, warning) random weights
    (seed 1); None for a one-transformer spec.

    Raises:
      CheckpointError: no weights and not `random_weights`, or a checkpoint that does not fit.
    """
    if spec.boundary_ratio is None:
        return None
    path = _transformer_2_path(None if checkpoint is None else Path(checkpoint))
    if path is not None:
        return spec.loader(path, spec.config, mesh=mesh, strategy=strategy)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [TRANSFORMER_2]))
    warn_random(spec, [TRANSFORMER_2])
    return random_transformer(spec, mesh, strategy, seed=1)


def load_image_encoder(
    spec: ModelSpec, checkpoint: str | os.PathLike | None, *, random_weights: bool = False
) -> nnx.Module | None:
    """The image encoder an image-to-video spec reads (`spec.image_encoder`) from
    `<checkpoint>/image_encoder` (a transformers export: its config.json's class, e.g.
    `CLIPVisionModel` or `SiglipVisionModel`, says which encoder; without a config.json, the
    spec's preset), or (only with `random_weights`, warning) random weights; None for a spec
    without one.

    Raises:
      CheckpointError: no weights and not `random_weights`, a checkpoint that does not fit, or
        an encoder class vidax does not run.
    """
    preset = spec.image_encoder_spec
    if preset is None:
        return None
    path = _image_encoder_path(None if checkpoint is None else Path(checkpoint))
    if path is not None:
        config_file = path / "config.json"
        if not config_file.is_file():
            return preset.loader(path, preset.config)
        config = pretrained.read_config(config_file)
        architectures = config.get("architectures") or []
        try:
            family = image_encoder_family(architectures[0]) if architectures else preset.family
        except ValueError as e:
            raise CheckpointError(f"{config_file}: {e}") from None
        module = IMAGE_ENCODER_FAMILIES[family].module
        return module.load(path, module.from_hf_config(config))
    if not random_weights:
        raise CheckpointError(missing_message(spec, [IMAGE_ENCODER]))
    warn_random(spec, [IMAGE_ENCODER])
    return random_image_encoder(spec)


def random_image_encoder(spec: ModelSpec) -> nnx.Module:
    """The spec's image encoder preset on random initialisation (seed 0)."""
    preset = spec.image_encoder_spec
    if preset is None:
        raise ValueError(f"model {spec.name!r} has no image encoder")
    return preset.build(seed=0)


def random_transformer(
    spec: ModelSpec, mesh=None, strategy: str | None = None, *, seed: int = 0
) -> VideoDiT:
    """The spec's DiT on random initialisation, placed sharded over `mesh` if given."""
    model = spec.build(seed=seed)
    if mesh is not None:
        state = nnx.state(model)
        nnx.update(model, jax.device_put(state, param_shardings(state, mesh, strategy or "fsdp")))
    return model


def load_vae(
    spec: ModelSpec, checkpoint: str | os.PathLike | None, *, random_weights: bool = False
):
    """The spec's VAE from `<checkpoint>/vae`, its shipped weights, or (only with
    `random_weights`, warning) random weights; None for a spec without a VAE.

    Raises:
      CheckpointError: no weights and not `random_weights`, or a checkpoint that does not fit.
    """
    vae = spec.vae_spec
    if vae is None:
        return None
    path = _vae_path(spec, None if checkpoint is None else Path(checkpoint))
    if path is not None:
        return vae.loader(path, vae.config)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [VAE]))
    warn_random(spec, [VAE])
    return vae.build(seed=0)


def _vae_path(spec: ModelSpec, root: Path | None) -> Path | None:
    vae = spec.vae_spec
    if vae is None:
        return None
    if vae.path is not None:  # read from a checkpoint or given by --vae
        return vae.path
    if root is not None and (root / "vae").is_dir():
        return root / "vae"
    return shipped(spec, "vae.safetensors")


def load_folder(spec: ModelSpec, folder: str | os.PathLike):
    """(transformer, VAE, text encoder) of `spec` from a weights folder.

    The folder holds transformer.safetensors and vae.safetensors (and text_encoder.safetensors
    for presets with a trained text encoder), as `vidax train all` / `vidax train export`
    write them; a `latent_stats.json` beside the VAE replaces the preset's latent statistics.
    The text encoder is None for presets without one.

    Raises:
      FileNotFoundError: a file the folder should hold is missing.
    """
    folder = Path(folder)
    vae = spec.vae_spec
    if vae is None:
        raise ValueError(f"model {spec.name!r} has no VAE")
    needed = ["transformer.safetensors", "vae.safetensors"]
    if spec.text_config is not None:
        needed.append(TEXT_ENCODER_FILE)
    for name in needed:
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name} not found")
    config = vae.config
    stats = folder / "latent_stats.json"
    if stats.exists():
        values = json.loads(stats.read_text())
        config = dataclasses.replace(
            config, latents_mean=tuple(values["mean"]), latents_std=tuple(values["std"])
        )
    text = None
    if spec.text_config is not None:
        text = word_encoder.load(folder / TEXT_ENCODER_FILE, spec.text_config)
    transformer = spec.loader(folder / "transformer.safetensors", spec.config)
    return transformer, vae.loader(folder / "vae.safetensors", config), text


def load_text_encoder(
    spec: ModelSpec, checkpoint: str | os.PathLike | None = None, *, random_weights: bool = False
) -> word_encoder.WordEncoder:
    """The spec's trained `WordEncoder`: `<checkpoint>/text_encoder.safetensors` (a weights
    folder), else the shipped one, else (only with `random_weights`, warning) random weights.

    Raises:
      CheckpointError: no weights and not `random_weights`.
    """
    if spec.text_config is None:
        raise ValueError(f"model {spec.name!r} has no trained text encoder")
    path = _text_encoder_path(spec, checkpoint)
    if path is not None:
        return cached_text_encoder(path, spec.text_config)
    if not random_weights:
        raise CheckpointError(missing_message(spec, [TEXT_ENCODER]))
    warn_random(spec, [TEXT_ENCODER])
    return random_text_encoder(spec)


def random_text_encoder(spec: ModelSpec) -> word_encoder.WordEncoder:
    """The spec's `WordEncoder` on random initialisation (seed 0)."""
    return word_encoder.WordEncoder(spec.text_config, rngs=nnx.Rngs(0))


def cached_text_encoder(path: str | os.PathLike, config) -> word_encoder.WordEncoder:
    """The `WordEncoder` at `path` (its .safetensors file or the folder holding it), read once."""
    path = Path(path)
    if path.is_dir():
        path = path / TEXT_ENCODER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"text encoder weights not found: {path}")
    return _read_text_encoder(str(path), config)


@functools.lru_cache(maxsize=2)
def _read_text_encoder(path: str, config) -> word_encoder.WordEncoder:
    return word_encoder.load(path, config)


def _text_encoder_path(spec: ModelSpec, checkpoint) -> Path | None:
    if checkpoint is not None and (Path(checkpoint) / TEXT_ENCODER_FILE).is_file():
        return Path(checkpoint) / TEXT_ENCODER_FILE
    if spec.text_encoder_weights is not None:  # pinned apart from the transformer's
        path = ASSETS / spec.text_encoder_weights / TEXT_ENCODER_FILE
        return path if path.exists() else None
    return shipped(spec, TEXT_ENCODER_FILE)


def shipped(spec: ModelSpec, filename: str) -> Path | None:
    """`filename` in the spec's shipped weights folder (`vidax/assets/<weights>`), if there."""
    if spec.weights is None:
        return None
    path = ASSETS / spec.weights / filename
    return path if path.exists() else None
