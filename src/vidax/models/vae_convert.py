"""Checkpoint plumbing shared by the video VAEs' diffusers key maps (Wan, HunyuanVideo, 1.5).

Layouts: torch Conv3d (out, in, kt, kh, kw) <-> (kt, kh, kw, in, out); Conv2d (out, in, kh, kw)
<-> (kh, kw, in, out); RMS norm gamma (c, 1, 1, 1) or, per frame, (c, 1, 1) <-> (c,).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flax import nnx
from jax.sharding import Mesh

from vidax.checkpoint import Rule, save_model
from vidax.models.dit_config import load_converted
from vidax.models.video_vae import VideoVAE

Model = TypeVar("Model", bound=nnx.Module)
Config = TypeVar("Config")


def _conv3d_to_jax(w):
    return w.transpose(2, 3, 4, 1, 0)


def _conv3d_to_torch(w):
    return w.transpose(4, 3, 0, 1, 2)


def _conv2d_to_jax(w):
    return w.transpose(2, 3, 1, 0)


def _conv2d_to_torch(w):
    return w.transpose(3, 2, 0, 1)


def _flatten(g):
    return g.reshape(-1)


def _gamma_3d(g):
    return g.reshape(-1, 1, 1, 1)


def _gamma_2d(g):
    return g.reshape(-1, 1, 1)


CONV3D = {"transform": _conv3d_to_jax, "inverse": _conv3d_to_torch}
CONV2D = {"transform": _conv2d_to_jax, "inverse": _conv2d_to_torch}
GAMMA_VIDEO = {"transform": _flatten, "inverse": _gamma_3d}  # images=False norms
GAMMA_IMAGE = {"transform": _flatten, "inverse": _gamma_2d}  # per-frame (attention) norms


def conv_rules(source: str, target: str, layout: dict = CONV3D) -> list[Rule]:
    """The weight -> kernel (in `layout`) and bias rules of one convolution."""
    return [
        Rule(f"{source}.weight", f"{target}.kernel", **layout),
        Rule(f"{source}.bias", f"{target}.bias"),
    ]


def load_vae(
    cls: Callable[..., Model],
    presets: Mapping[str, Config],
    key_map: Callable[[Config], list[Rule]],
    path: str | os.PathLike,
    config: Config | str,
    *,
    mesh: Mesh | None = None,
    strategy=None,
) -> Model:
    """Builds `cls(config)` straight from a diffusers-layout safetensors checkpoint.

    Args:
      cls: the VAE class, built as `cls(config, rngs=...)`.
      presets: its named configs; `config` may be one of their names.
      key_map: config -> the rules covering every parameter once.
      path: a safetensors file, index, or directory (e.g. a diffusers `vae/` folder).
      config: a config of `cls` or a `presets` name.
      mesh / strategy: optional placement of every parameter (see `vidax.checkpoint`).

    Raises:
      ValueError: `config` names no preset.
      CheckpointError: naming every missing, unexpected or mis-shaped key.
    """
    if isinstance(config, str):
        try:
            config = presets[config]
        except KeyError:
            raise ValueError(
                f"unknown {cls.__name__} preset {config!r}; choose from {sorted(presets)}"
            ) from None
    return load_converted(cls, key_map, path, config, mesh=mesh, strategy=strategy)


def save_vae(
    vae: VideoVAE,
    key_map: Callable[[Any], list[Rule]],
    path: str | os.PathLike,
    **kwargs,
) -> None:
    """Writes `vae` as a diffusers-layout safetensors file (kwargs: see `save_model`)."""
    save_model(vae, path, key_map(vae.config), **kwargs)
