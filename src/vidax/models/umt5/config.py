"""UMT5 text-encoder configuration and presets."""

from __future__ import annotations

import dataclasses

from vidax.models.dit_config import ConfigDtypes, check_dtypes

# float16 is left out on purpose: T5's gated FFN overflows it (transformers keeps `wo` in float32
# and clamps activations to cope); bfloat16 has float32's range and needs neither.
_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class UMT5Config(ConfigDtypes):
    """Architecture and numerics of an encoder-only UMT5 (the text encoder of Wan 2.1).

    Attributes:
      vocab_size: rows of the token embedding.
      d_model: model width d.
      d_kv: head dim k (n * k need not equal d).
      d_ff: gated FFN hidden width f.
      num_layers: encoder blocks, stacked and scanned.
      num_heads: attention heads n.
      relative_attention_num_buckets: buckets of the relative position bias (both directions).
      relative_attention_max_distance: distance from which all positions share the last bucket.
      eps: epsilon of the RMS layer norms.
      dtype: compute dtype of the matmuls (norms, softmax and the residual stream stay float32).
      param_dtype: storage dtype of parameters.
    """

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    eps: float = 1e-6
    dtype: str = "bfloat16"
    param_dtype: str = "bfloat16"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"UMT5Config.{name} must be positive, got {getattr(self, name)}")
        buckets = self.relative_attention_num_buckets
        # The encoder halves the buckets per direction and keeps half of those for exact distances.
        if buckets < 4 or buckets % 2:
            raise ValueError(
                f"UMT5Config.relative_attention_num_buckets must be even and >= 4, got {buckets}"
            )
        if self.relative_attention_max_distance <= buckets // 4:
            raise ValueError(
                "UMT5Config.relative_attention_max_distance must exceed "
                f"relative_attention_num_buckets // 4 = {buckets // 4}, "
                f"got {self.relative_attention_max_distance}"
            )
        if not self.eps > 0:
            raise ValueError(f"UMT5Config.eps must be positive, got {self.eps}")
        check_dtypes(self, _DTYPES)

    @property
    def inner_dim(self) -> int:
        """Width of the attention projections, n * k."""
        return self.num_heads * self.d_kv

    @property
    def num_params(self) -> int:
        """Parameter count, e.g. to size host memory before loading."""
        d, f, i = self.d_model, self.d_ff, self.inner_dim
        per_layer = 4 * d * i + self.relative_attention_num_buckets * self.num_heads
        per_layer += 3 * d * f + 2 * d
        return self.vocab_size * d + self.num_layers * per_layer + d


PRESETS: dict[str, UMT5Config] = {
    # google/umt5-xxl; the encoder half is Wan 2.1's text encoder (4096-wide outputs).
    "umt5-xxl": UMT5Config(
        vocab_size=256_384,
        d_model=4096,
        d_kv=64,
        d_ff=10_240,
        num_layers=24,
        num_heads=64,
    ),
    "tiny": UMT5Config(
        vocab_size=512,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        dtype="float32",
        param_dtype="float32",
    ),
}


_HF_KEYS = {
    "vocab_size": "vocab_size",
    "d_model": "d_model",
    "d_kv": "d_kv",
    "d_ff": "d_ff",
    "num_layers": "num_layers",
    "num_heads": "num_heads",
    "relative_attention_num_buckets": "relative_attention_num_buckets",
    "relative_attention_max_distance": "relative_attention_max_distance",
    "layer_norm_epsilon": "eps",
}


def from_hf_config(config: dict, **overrides) -> UMT5Config:
    """A `UMT5Config` from a Hugging Face UMT5 `config.json` (as a dict).

    Parameters are stored in the checkpoint's own dtype (`torch_dtype`, or `dtype` in newer
    transformers) when it is float32 or bfloat16: storing float32 weights as bfloat16 (the
    config's default) moved the embeddings by ~0.3% of their scale. `overrides` win.

    Raises:
      ValueError: if the config is not a gated-GELU UMT5/T5 encoder.
    """
    act = config.get("feed_forward_proj", "gated-gelu")
    if act != "gated-gelu":
        raise ValueError(
            f"only gated-gelu UMT5 encoders are supported, got feed_forward_proj={act!r}"
        )
    required = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(f"UMT5 config.json lacks {missing}")
    kwargs = {ours: config[theirs] for theirs, ours in _HF_KEYS.items() if theirs in config}
    stored = config.get("torch_dtype") or config.get("dtype")
    if stored in _DTYPES:
        kwargs["param_dtype"] = stored
    return UMT5Config(**{**kwargs, **overrides})
