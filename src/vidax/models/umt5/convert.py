"""Key map: Hugging Face `UMT5EncoderModel` / `UMT5Model` safetensors <-> vidax `UMT5Encoder`."""

from __future__ import annotations

import os

from flax import nnx

from vidax.checkpoint import Rule, linear_rules, load_model, open_checkpoint
from vidax.models.umt5.config import UMT5Config
from vidax.models.umt5.model import UMT5Encoder

# The token embedding is tied: `UMT5EncoderModel` owns it as `shared.weight` and the encoder
# stack reuses it as `encoder.embed_tokens.weight`. Exports hold one or both (same tensor).
EMBEDDING_KEYS = ("shared.weight", "encoder.embed_tokens.weight")

# A full encoder-decoder checkpoint (e.g. google/umt5-xxl) also loads: its decoder half is unused.
IGNORED = ("decoder.*", "lm_head.weight")


def key_map(config: UMT5Config, *, embedding_key: str = EMBEDDING_KEYS[0]) -> list[Rule]:
    """Declarative map from transformers keys to vidax parameter paths (see `vidax.checkpoint`).

    Args:
      config: the encoder's configuration (the map is the same for every size).
      embedding_key: which of the tied `EMBEDDING_KEYS` provides the token embedding.
    """
    del config  # every UMT5 encoder has the same keys; the layer count comes from the model
    if embedding_key not in EMBEDDING_KEYS:
        raise ValueError(f"embedding_key must be one of {EMBEDDING_KEYS}, got {embedding_key!r}")
    block = "encoder.block.{i}.layer"
    rules = [
        Rule(embedding_key, "embed_tokens"),
        Rule("encoder.final_layer_norm.weight", "final_norm.scale"),
        Rule(f"{block}.0.layer_norm.weight", "blocks.attention_norm.scale"),
        # nn.Embedding(buckets, n).weight is already (buckets, n).
        Rule(
            f"{block}.0.SelfAttention.relative_attention_bias.weight",
            "blocks.attention.relative_attention_bias",
        ),
        Rule(f"{block}.1.layer_norm.weight", "blocks.ffn_norm.scale"),
    ]
    for proj in ("q", "k", "v", "o"):
        rules += linear_rules(f"{block}.0.SelfAttention.{proj}", f"blocks.attention.{proj}", False)
    for proj in ("wi_0", "wi_1", "wo"):
        rules += linear_rules(f"{block}.1.DenseReluDense.{proj}", f"blocks.ffn.{proj}", False)
    return rules


def load(path: str | os.PathLike, config: UMT5Config, *, mesh=None, strategy=None):
    """Builds a `UMT5Encoder` from a transformers checkpoint (file, index or directory).

    Accepts `UMT5EncoderModel` exports (Wan's `text_encoder/`) and full `UMT5Model` /
    `UMT5ForConditionalGeneration` checkpoints, whose decoder is skipped.

    Raises:
      CheckpointError: the checkpoint is missing, corrupt or does not match `config`, naming
        the offending keys.
    """

    # Only the header is read here; tensors are streamed by `load_model`.
    keys = set(open_checkpoint(path))
    present = [k for k in EMBEDDING_KEYS if k in keys]
    embedding_key = present[0] if present else EMBEDDING_KEYS[0]  # absent: reported as missing
    return load_model(
        lambda: UMT5Encoder(config, rngs=nnx.Rngs(0)),
        path,
        key_map(config, embedding_key=embedding_key),
        mesh=mesh,
        strategy=strategy,
        ignore=(*IGNORED, *(k for k in EMBEDDING_KEYS if k != embedding_key)),
    )
