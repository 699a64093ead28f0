"""CLIP vision-encoder configuration and presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vidax.models.dit_config import ConfigDtypes
from vidax.nn.attention import IMPLEMENTATIONS

_DTYPES = ("float32", "bfloat16", "float16")
ACTIVATIONS = ("quick_gelu", "gelu")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CLIPVisionConfig(ConfigDtypes):
    """Architecture and numerics of a CLIP ViT image encoder (transformers' `CLIPVisionModel`).

    Attributes:
      hidden_size: model width d (= num_attention_heads * head_dim).
      intermediate_size: MLP hidden width f.
      num_hidden_layers: encoder layers, stacked and scanned.
      num_attention_heads: attention heads n.
      image_size: side of the square input image, in pixels (the position table is learned
        for exactly this size).
      patch_size: side of a square patch; must divide image_size.
      num_channels: input channels (3: RGB).
      layer_norm_eps: epsilon of every layer norm.
      hidden_act: MLP activation, "quick_gelu" (x * sigmoid(1.702 x), OpenAI's CLIP and
        transformers' default) or "gelu" (exact, erf; OpenCLIP's LAION models such as ViT-H/14).
      dtype: compute dtype of the matmuls (layer norms and the residual stream stay float32).
      param_dtype: storage dtype of parameters.
      attention_impl: `vidax.nn.attention` implementation.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "auto"

    def __post_init__(self):
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "image_size",
            "patch_size",
            "num_channels",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"CLIPVisionConfig.{name} must be positive, got {getattr(self, name)}"
                )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"CLIPVisionConfig.hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"CLIPVisionConfig.patch_size {self.patch_size} must divide image_size "
                f"{self.image_size}"
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(
                f"CLIPVisionConfig.layer_norm_eps must be positive, got {self.layer_norm_eps}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"CLIPVisionConfig.hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"CLIPVisionConfig.{name} must be one of {_DTYPES}, got {getattr(self, name)!r}"
                )
        if self.attention_impl not in IMPLEMENTATIONS:
            raise ValueError(
                f"CLIPVisionConfig.attention_impl must be one of {IMPLEMENTATIONS}, "
                f"got {self.attention_impl!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid(self) -> int:
        """Patches along each side of the image."""
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        """Tokens of one image: the class token, then grid * grid patches."""
        return 1 + self.grid**2

    @property
    def patch_features(self) -> int:
        """Features of one flattened patch (patch_size * patch_size * num_channels)."""
        return self.patch_size**2 * self.num_channels

    @property
    def num_params(self) -> int:
        """Parameter count, e.g. to size host memory before loading."""
        d, f = self.hidden_size, self.intermediate_size
        embeddings = self.patch_features * d + d + self.num_tokens * d
        per_layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
        return embeddings + self.num_hidden_layers * per_layer + 2 * 2 * d


PRESETS: dict[str, CLIPVisionConfig] = {
    # OpenCLIP ViT-H/14 (laion/CLIP-ViT-H-14-laion2B-s32B-b79K): the `image_encoder/` of Wan 2.1
    # image-to-video, whose 1280-wide penultimate hidden states are the DiT's image tokens.
    "clip-vit-h-14": CLIPVisionConfig(
        hidden_size=1280,
        intermediate_size=5120,
        num_hidden_layers=32,
        num_attention_heads=16,
        image_size=224,
        patch_size=14,
        hidden_act="gelu",
    ),
    "tiny": CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    ),
}


# transformers' `CLIPVisionConfig` key -> our field; all but these have the default above.
_HF_KEYS = {
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "image_size": "image_size",
    "patch_size": "patch_size",
    "num_channels": "num_channels",
    "layer_norm_eps": "layer_norm_eps",
    "hidden_act": "hidden_act",
}
_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "image_size",
    "patch_size",
)

# Keys that do not change the encoder's forward pass at inference: CLIP's own (dropout is
# training-only, the projection belongs to `CLIPVisionModelWithProjection`), then the generic
# `PretrainedConfig` fields that transformers 4.x wrote into every sub-config (generation
# settings, labels, output switches) and 5.x still writes.
_NO_EFFECT = frozenset(
    {
        "attention_dropout",
        "dropout",
        "initializer_factor",
        "initializer_range",
        "projection_dim",
        "model_type",
        "architectures",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_bfloat16",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "tf_legacy_loss",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "cross_attention_hidden_size",
        "add_cross_attention",
        "tie_encoder_decoder",
        "tie_word_embeddings",
        "gradient_checkpointing",
        "use_cache",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "finetuning_task",
        "id2label",
        "label2id",
        "problem_type",
        "tokenizer_class",
        "prefix",
        "bos_token_id",
        "pad_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
    }
)


def from_hf_config(config: Mapping[str, Any], **overrides) -> CLIPVisionConfig:
    """A `CLIPVisionConfig` from a transformers `config.json` (as a dict).

    Accepts a `CLIPVisionConfig` (`model_type` "clip_vision_model", e.g. Wan's
    `image_encoder/config.json`) or a full `CLIPConfig`, whose `vision_config` is read.
    Parameters are stored in the checkpoint's own dtype (`torch_dtype`, or `dtype` in newer
    transformers) when it is one we support, else float32. `overrides` win.

    Raises:
      ValueError: a size is missing, or a key is unknown or set to something this port does
        not implement (e.g. pruned heads): nothing the config says is dropped silently.
    """
    stored = config.get("torch_dtype") or config.get("dtype")
    if "vision_config" in config or "vision_config_dict" in config:
        vision = config.get("vision_config") or config.get("vision_config_dict")
        if not isinstance(vision, Mapping):
            raise ValueError(f"CLIPConfig.vision_config must be a dict, got {vision!r}")
        config = vision
        stored = config.get("torch_dtype") or config.get("dtype") or stored
    model_type = config.get("model_type", "clip_vision_model")
    if model_type != "clip_vision_model":
        raise ValueError(f"not a CLIP vision config: model_type={model_type!r}")
    if config.get("pruned_heads"):
        raise ValueError(f"CLIP vision config with pruned_heads is not supported: {config!r}")
    unknown = sorted(
        k
        for k in config
        if not k.startswith("_") and k not in {*_HF_KEYS, *_NO_EFFECT, "pruned_heads"}
    )
    if unknown:
        raise ValueError(f"unknown CLIP vision config keys {unknown}")
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ValueError(f"CLIP vision config.json lacks {missing}")
    kwargs: dict[str, Any] = {
        ours: config[theirs] for theirs, ours in _HF_KEYS.items() if theirs in config
    }
    if stored in _DTYPES:
        kwargs["param_dtype"] = stored
    return CLIPVisionConfig(**{**kwargs, **overrides})
