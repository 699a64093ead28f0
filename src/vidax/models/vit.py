"""What the ViT image encoders of image-to-video models share (`clip_vision`, `siglip_vision`).

Both are transformers' pre-norm vision transformer: non-overlapping patches (a stride-p
convolution, here a Linear over flattened patches) plus a learned position table, then layers of
LayerNorm -> multi-head self-attention with biases -> residual, LayerNorm -> MLP -> residual.
The families differ only around those layers (CLIP: a class token and a norm before the layers;
SigLIP: a patch bias and a norm after them over every token) and in preprocessing, so this module
holds the common parts: the config fields and their checks, the encoder layer, the patch and
position parameters, the key-map rules of the layers, the transformers config reader and the
PIL preprocessing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Float
from PIL import Image

from vidax.checkpoint import Rule, linear_rules, open_checkpoint
from vidax.models.dit_config import DTYPES, ConfigDtypes, check_dtypes, load_converted
from vidax.nn import FeedForward, LayerNorm, Linear, attention
from vidax.nn.attention import IMPLEMENTATIONS
from vidax.nn.layers import gelu_tanh, param
from vidax.nn.scan import scan_layers, stack_layers
from vidax.sharding import shard

# The size fields of `ViTConfig`, all positive.
_SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "image_size",
    "patch_size",
    "num_channels",
)
TOKENS = ("batch", "tokens", "embed")
_HEADS = ("batch", "attn_tokens", "attn_heads", "head_dim")


def quick_gelu(x: jax.Array) -> jax.Array:
    """x * sigmoid(1.702 x): OpenAI CLIP's GELU approximation (transformers' "quick_gelu").

    Module-level, like `nn.layers.gelu_tanh`: a module keeps its activation as a static
    attribute, and a lambda per model would make two loads of one checkpoint different graphs.
    """
    return x * jax.nn.sigmoid(1.702 * x)


def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, transformers' "gelu"."""
    return jax.nn.gelu(x, approximate=False)


# transformers' `hidden_act` names -> the activation.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "quick_gelu": quick_gelu,
    "gelu": gelu,
    "gelu_pytorch_tanh": gelu_tanh,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTConfig(ConfigDtypes):
    """Architecture and numerics of a ViT image encoder (the fields CLIP and SigLIP share).

    Attributes:
      hidden_size: model width d (= num_attention_heads * head_dim).
      intermediate_size: MLP hidden width f.
      num_hidden_layers: encoder layers, stacked and scanned.
      num_attention_heads: attention heads n.
      image_size: side of the square input image, in pixels (the position table is learned
        for exactly this size).
      patch_size: side of a square patch. As transformers' stride-p convolution does, the
        last image_size % patch_size rows and columns are not read.
      num_channels: input channels (3: RGB).
      layer_norm_eps: epsilon of every layer norm.
      hidden_act: MLP activation by transformers' name: "quick_gelu" (x * sigmoid(1.702 x)),
        "gelu" (exact, erf) or "gelu_pytorch_tanh" (tanh approximation).
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
    layer_norm_eps: float
    hidden_act: str
    dtype: str = "float32"
    param_dtype: str = "float32"
    attention_impl: str = "auto"

    def __post_init__(self):
        name = type(self).__name__
        for field in _SIZES:
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field} must be positive, got {getattr(self, field)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}.hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.patch_size > self.image_size:
            raise ValueError(
                f"{name}.patch_size {self.patch_size} is larger than image_size {self.image_size}"
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(f"{name}.layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"{name}.hidden_act must be one of {tuple(ACTIVATIONS)}, got {self.hidden_act!r}"
            )
        check_dtypes(self)
        if self.attention_impl not in IMPLEMENTATIONS:
            raise ValueError(
                f"{name}.attention_impl must be one of {IMPLEMENTATIONS}, "
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
    def num_patches(self) -> int:
        return self.grid**2

    @property
    def patch_features(self) -> int:
        """Features of one flattened patch (patch_size * patch_size * num_channels)."""
        return self.patch_size**2 * self.num_channels

    @property
    def layer_params(self) -> int:
        """Parameters of one encoder layer (attention, MLP, two layer norms)."""
        d, f = self.hidden_size, self.intermediate_size
        return 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d


# -- layers ----------------------------------------------------------------------------------------


class ViTAttention(nnx.Module):
    """Multi-head self-attention with biased q/k/v/out projections, scaled by 1/sqrt(k)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        attention_impl: str,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.k = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.v = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.out = Linear(dim, dim, axes=("heads", "embed"), **kw)
        self.num_heads = num_heads
        self.attention_impl = attention_impl

    def __call__(self, x: Float[Array, "b l d"]) -> Float[Array, "b l d"]:
        split = lambda y: rearrange(y, "b l (n k) -> b l n k", n=self.num_heads)
        q = shard(split(self.q(x)), _HEADS)
        kv_axes = ("batch", "kv_tokens", "attn_heads", "head_dim")
        k, v = shard(split(self.k(x)), kv_axes), shard(split(self.v(x)), kv_axes)
        o = shard(attention(q, k, v, impl=self.attention_impl), _HEADS)
        return self.out(rearrange(o, "b l n k -> b l (n k)"))


class ViTEncoderLayer(nnx.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); norms and the residual stream are float32."""

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
        c = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        norm: dict[str, Any] = dict(eps=c.layer_norm_eps, param_dtype=c.storage_dtype)
        self.attention_norm = LayerNorm(c.hidden_size, **norm)
        self.attention = ViTAttention(
            c.hidden_size, c.num_attention_heads, attention_impl=c.attention_impl, **kw
        )
        self.mlp_norm = LayerNorm(c.hidden_size, **norm)
        self.mlp = FeedForward(
            c.hidden_size, c.intermediate_size, activation=ACTIVATIONS[c.hidden_act], **kw
        )
        self.dtype = c.compute_dtype

    def __call__(self, x: Float[Array, "b l d"]) -> Float[Array, "b l d"]:
        h = self.attention_norm(x).astype(self.dtype)
        x = x + self.attention(h).astype(jnp.float32)
        h = self.mlp_norm(x).astype(self.dtype)
        x = x + self.mlp(h).astype(jnp.float32)
        return shard(x, TOKENS)


def encoder_layers(config: ViTConfig, rngs: nnx.Rngs) -> ViTEncoderLayer:
    """The encoder's layers, stacked on a leading "layers" axis (`vidax.nn.scan`)."""
    return stack_layers(
        config.num_hidden_layers, lambda rngs: ViTEncoderLayer(config, rngs=rngs), rngs
    )


def patch_embedding(config: ViTConfig, *, use_bias: bool, rngs: nnx.Rngs) -> Linear:
    """The patch projection (p*p*c -> d) over patches flattened in (ph, pw, c) order."""
    return Linear(
        config.patch_features,
        config.hidden_size,
        axes=("patch", "embed"),
        use_bias=use_bias,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        rngs=rngs,
    )


def position_table(config: ViTConfig, num_tokens: int, rngs: nnx.Rngs) -> nnx.Param:
    """A learned (tokens, d) position table; the token axis is small and never sharded."""
    positions = jax.random.normal(rngs.params(), (num_tokens, config.hidden_size), jnp.float32)
    return param((positions * 0.02).astype(config.storage_dtype), (None, "embed"))


def patches(
    pixels: Float[Array, "b H W c"], config: ViTConfig, family: str
) -> Float[Array, "b l p"]:
    """Channels-last pixels -> (b, grid^2, patch_features) flattened patches, row-major.

    Raises:
      ValueError: pixels not (b, image_size, image_size, num_channels); `family` names the
        package whose `preprocess` makes them.
    """
    c = config
    if pixels.ndim != 4 or pixels.shape[1:] != (c.image_size, c.image_size, c.num_channels):
        raise ValueError(
            f"pixels must be (b, {c.image_size}, {c.image_size}, {c.num_channels}) "
            f"channels-last (see {family}.preprocess), got shape {pixels.shape}"
        )
    side = c.grid * c.patch_size
    return rearrange(
        pixels[:, :side, :side],
        "b (gh ph) (gw pw) c -> b (gh gw) (ph pw c)",
        ph=c.patch_size,
        pw=c.patch_size,
    )


def run_layers(
    blocks: ViTEncoderLayer, x: Float[Array, "b l d"], layer: int, num_layers: int
) -> Float[Array, "b l d"]:
    """transformers' `hidden_states[layer]` from the embeddings `x` (`hidden_states[0]`),
    running no layer after it.

    Raises:
      ValueError: `layer` does not index the num_layers + 1 hidden states.
    """
    if not -(num_layers + 1) <= layer <= num_layers:
        raise ValueError(
            f"layer must index the {num_layers + 1} hidden states "
            f"({-(num_layers + 1)}..{num_layers}), got {layer}"
        )
    return scan_layers(blocks, x, lambda block, x: block(x), layers=layer % (num_layers + 1))


# -- checkpoints -----------------------------------------------------------------------------------

# Checkpoints written by transformers 4.x (and any two-tower model) nest the encoder under
# "vision_model."; transformers 5 saves a `*VisionModel` without the prefix.
PREFIXES = ("vision_model.", "")

Encoder = TypeVar("Encoder", bound=nnx.Module)


def patch_rule(source: str, target: str, config: ViTConfig) -> Rule:
    """The Conv2d (d, c, p, p) patch weight <-> the Linear (p*p*c, d) kernel, rows (ph, pw, c)."""
    p, c, d = config.patch_size, config.num_channels, config.hidden_size
    return Rule(
        source,
        target,
        lambda w: w.transpose(2, 3, 1, 0).reshape(p * p * c, d),
        lambda k: k.reshape(p, p, c, d).transpose(3, 2, 0, 1),
    )


def norm_rules(source: str, target: str) -> list[Rule]:
    """A torch LayerNorm (weight, bias) <-> a vidax `LayerNorm` (scale, bias)."""
    return [Rule(f"{source}.weight", f"{target}.scale"), Rule(f"{source}.bias", f"{target}.bias")]


def layer_rules(prefix: str) -> list[Rule]:
    """The rules of transformers' `encoder.layers.{i}` (CLIP's and SigLIP's are named alike)
    under `prefix`, one of `PREFIXES`."""
    if prefix not in PREFIXES:
        raise ValueError(f"prefix must be one of {PREFIXES}, got {prefix!r}")
    layer = f"{prefix}encoder.layers.{{i}}"
    rules = [
        *norm_rules(f"{layer}.layer_norm1", "blocks.attention_norm"),
        *norm_rules(f"{layer}.layer_norm2", "blocks.mlp_norm"),
    ]
    for proj in ("q", "k", "v", "out"):
        rules += linear_rules(f"{layer}.self_attn.{proj}_proj", f"blocks.attention.{proj}")
    rules += linear_rules(f"{layer}.mlp.fc1", "blocks.mlp.proj_in")
    rules += linear_rules(f"{layer}.mlp.fc2", "blocks.mlp.proj_out")
    return rules


def load(
    cls: Callable[..., Encoder],
    key_map: Callable[..., list[Rule]],
    path: str | os.PathLike,
    config: ViTConfig,
    *,
    ignore: Iterable[str],
    mesh=None,
    strategy=None,
) -> Encoder:
    """Builds `cls(config)` from a transformers checkpoint (file, index or directory) whose keys
    carry either of `PREFIXES`; `key_map(config, prefix=...)` names them, `ignore` lists the
    keys that are not the encoder's.

    Raises:
      CheckpointError: the checkpoint is missing, corrupt or does not match `config`, naming
        the offending keys.
    """
    # Only the header is read here; tensors are streamed by the loader.
    keys = open_checkpoint(path)
    prefix = PREFIXES[0] if any(k.startswith(PREFIXES[0]) for k in keys) else PREFIXES[1]
    return load_converted(
        cls,
        lambda config: key_map(config, prefix=prefix),
        path,
        config,
        mesh=mesh,
        strategy=strategy,
        ignore=ignore,
    )


# transformers' vision-config keys, our fields of the same names; all but these have the
# config's defaults, and all but the channels must be given.
HF_KEYS = (*_SIZES, "layer_norm_eps", "hidden_act")
_REQUIRED = _SIZES[:-1]

# Keys that do not change the encoder's forward pass at inference: dropout (training only),
# initialisation, then the generic `PretrainedConfig` fields that transformers 4.x wrote into
# every sub-config (generation settings, labels, output switches) and 5.x still writes.
NO_EFFECT = frozenset(
    {
        "attention_dropout",
        "dropout",
        "initializer_factor",
        "initializer_range",
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


def hf_config_fields(
    config: Mapping[str, Any], *, name: str, model_type: str, no_effect: frozenset[str]
) -> dict[str, Any]:
    """The `ViTConfig` fields a transformers vision `config.json` (as a dict) sets.

    Accepts the vision config itself or a full two-tower config, whose `vision_config` is read.
    Parameters are stored in the checkpoint's own dtype (`torch_dtype`, or `dtype` in newer
    transformers) when it is one we support.

    Args:
      name: the family in messages ("CLIP vision").
      model_type: the vision config's transformers `model_type`.
      no_effect: the family's own keys that do not change the forward pass (beside `NO_EFFECT`).

    Raises:
      ValueError: another model type, a size missing, or a key unknown or set to something this
        port does not implement (e.g. pruned heads): nothing the config says is dropped silently.
    """
    stored = config.get("torch_dtype") or config.get("dtype")
    if "vision_config" in config or "vision_config_dict" in config:
        vision = config.get("vision_config") or config.get("vision_config_dict")
        if not isinstance(vision, Mapping):
            raise ValueError(f"{name} config's vision_config must be a dict, got {vision!r}")
        config = vision
        stored = config.get("torch_dtype") or config.get("dtype") or stored
    found = config.get("model_type", model_type)
    if found != model_type:
        raise ValueError(f"not a {name} config: model_type={found!r}")
    if config.get("pruned_heads"):
        raise ValueError(f"{name} config with pruned_heads is not supported: {config!r}")
    known = {*HF_KEYS, *NO_EFFECT, *no_effect, "pruned_heads"}
    unknown = sorted(k for k in config if not k.startswith("_") and k not in known)
    if unknown:
        raise ValueError(f"unknown {name} config keys {unknown}")
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ValueError(f"{name} config.json lacks {missing}")
    fields: dict[str, Any] = {k: config[k] for k in HF_KEYS if k in config}
    for k in ("image_size", "patch_size"):  # transformers also allows [h, w]: square only here
        if isinstance(fields[k], list | tuple):
            if len(set(fields[k])) != 1:
                raise ValueError(f"{name} config: non-square {k} {fields[k]} is not supported")
            fields[k] = fields[k][0]
    if stored in DTYPES:
        fields["param_dtype"] = stored
    return fields


# -- preprocessing ---------------------------------------------------------------------------------


def preprocess(
    images: np.ndarray,
    config: ViTConfig,
    *,
    resized: Callable[[int, int], tuple[int, int]],
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
) -> np.ndarray:
    """RGB images -> an encoder's input, as transformers' PIL image processors make it: PIL
    bicubic resize of the 8-bit image to `resized(height, width)`, a centred image_size square
    crop (none when the resize already gives that), rescale by 1/255 in float64, normalise by
    `mean` and `std` in float32.

    Args:
      images: (b, H, W, 3) uint8 in [0, 255], or floating point in [0, 1] (rounded to uint8
        first: the processors resize 8-bit images).

    Returns:
      (b, image_size, image_size, 3) float32, channels-last.

    Raises:
      ValueError: the images are not a (b, H, W, 3) uint8 or float array.
    """
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or config.num_channels != 3:
        raise ValueError(
            f"images must be (b, H, W, 3) RGB for a 3-channel encoder, got shape {images.shape} "
            f"for num_channels={config.num_channels}"
        )
    if np.issubdtype(images.dtype, np.floating):
        images = np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)
    elif images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 or floating point, got {images.dtype}")
    size = config.image_size
    new_height, new_width = resized(*images.shape[1:3])
    top, left = (new_height - size) // 2, (new_width - size) // 2
    out = np.empty((images.shape[0], size, size, 3), np.float32)
    for i, image in enumerate(images):
        resized_image = Image.fromarray(image).resize(
            (new_width, new_height), Image.Resampling.BICUBIC
        )
        crop = np.asarray(resized_image)[top : top + size, left : left + size]
        out[i] = (crop.astype(np.float64) * (1 / 255)).astype(np.float32)
    return (out - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
