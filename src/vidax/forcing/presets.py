"""Causal presets: a registered base model plus its chunked-generation settings and weights.

A causal preset is not a `vidax.models.registry.ModelSpec`: it reuses one (the transformer
architecture, VAE and text encoder of `base`) and adds the two attention configurations it was
trained for and the asset folder of its causal weights. When the base model's VAE has been
retrained since, the preset pins the VAE its latents came from (`vae`, shipped beside the
causal weights):

    preset = get("tiny-causal")
    model = load_causal(preset, "sparse")      # vidax/assets/tiny-causal/sparse.safetensors
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from vidax.forcing.config import ForcingConfig
from vidax.forcing.model import CausalWan, load
from vidax.models.registry import ModelSpec
from vidax.models.registry import get as get_model

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CausalPreset:
    """A chunk-autoregressive model.

    Attributes:
      name: preset name ("tiny-causal").
      base: registered model whose transformer config, VAE and text encoder it uses.
      dense: the Self-Forcing configuration (dense window with attention sink).
      sparse: the Sparse Forcing configuration (persistent memory + selected neighbourhood).
      weights: asset folder holding `dense.safetensors` and `sparse.safetensors`.
      vae: VAE preset the causal weights were trained with, its weights in
        `<weights>/vae.safetensors`; None: the base model's VAE and weights.
      num_frames: default pixel frames of a generated video.
    """

    name: str
    base: str
    dense: ForcingConfig
    sparse: ForcingConfig
    weights: str | None = None
    vae: str | None = None
    num_frames: int = 81

    def __post_init__(self):
        if self.vae is not None and self.weights is None:
            raise ValueError(f"causal preset {self.name!r} pins a VAE but has no asset folder")

    @property
    def spec(self) -> ModelSpec:
        """The base model's spec, with this preset's VAE (`vidax.pipeline.load_vae` then loads
        `<weights>/vae.safetensors`)."""
        base = get_model(self.base)
        if self.vae is None:
            return base
        return dataclasses.replace(base, vae=self.vae, weights=self.weights)

    def forcing(self, attention: str) -> ForcingConfig:
        if attention not in ("dense", "sparse"):
            raise ValueError(f"attention must be 'dense' or 'sparse', got {attention!r}")
        return self.dense if attention == "dense" else self.sparse

    def weights_path(self, attention: str) -> Path | None:
        if self.weights is None:
            return None
        path = ASSETS / self.weights / f"{attention}.safetensors"
        return path if path.exists() else None


# The tiny preset at 64x64 pixels has 8x8 = 64 tokens per latent frame: blocks of 16 tokens are
# two token rows (4 blocks per frame). Dense keeps sink 3 + window 15 frames (+ the 3-frame
# chunk: 21 frames, Self-Forcing's 5 s); sparse keeps sink 3 + window 3 frames, a 10-block
# memory and a 12-token compressed ring, i.e. 0.56x the dense peak KV, and each tile of 64
# queries (one frame here) attends the sink, 8 of 12 window blocks and 6 of 10 memory blocks.
PRESETS: dict[str, CausalPreset] = {
    "tiny-causal": CausalPreset(
        name="tiny-causal",
        base="tiny",
        dense=ForcingConfig(sink_frames=3, window_frames=15, block_size=16),
        sparse=ForcingConfig(
            sink_frames=3,
            window_frames=3,
            block_size=16,
            attention="sparse",
            memory_blocks=10,
            local_topk=8,
            memory_topk=6,
            compressed_tokens=12,
            query_tile=64,
        ),
        weights="tiny-causal",
        vae="shapes-v1",
    ),
}


def get(name: str) -> CausalPreset:
    """The causal preset `name`; a clear error lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown causal model {name!r}; known causal models: {', '.join(sorted(PRESETS))}"
        ) from None


def load_causal(
    preset: CausalPreset, attention: str, path=None, *, random_weights: bool = False
) -> CausalWan:
    """The causal model for `attention`: `path`, the shipped causal weights, else the base
    model's shipped bidirectional weights (untrained as a causal model: warns), else (only with
    `random_weights`, warning) random weights.

    Raises:
      FileNotFoundError: `path` does not exist.
      CheckpointError: no weights at all and not `random_weights`.
    """
    from vidax.pipeline import load_transformer

    spec = preset.spec
    path = path if path is not None else preset.weights_path(attention)
    if path is not None:
        if not Path(path).exists():
            raise FileNotFoundError(f"causal weights not found: {path}")
        return load(path, spec.config)
    warnings.warn(
        f"no causal weights for {preset.name!r} ({attention}): starting from the base model "
        f"{preset.base!r}, which was not trained to generate chunk by chunk",
        stacklevel=2,
    )
    base = load_transformer(get_model(preset.base), None, random_weights=random_weights)
    return CausalWan.from_transformer(base)
