"""Where a causal model's weights come from: the given file, the preset's shipped causal weights,
or its base model's bidirectional weights (warning).

    preset = vidax.models.get_causal("tiny-causal")
    model = load_causal(preset, "sparse")      # vidax/assets/tiny-causal/sparse.safetensors
"""

from __future__ import annotations

import warnings
from pathlib import Path

from vidax.forcing.model import CausalWan, load
from vidax.models.registry import CausalPreset
from vidax.models.registry import get as get_model


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
    base = get_model(preset.base).load(random_weights=random_weights)
    return CausalWan.from_transformer(base)
