"""Prompts -> embeddings for a preset: its text encoder, or precomputed embeddings from a file.

text = embed_prompts(get("tiny"), ["a red circle bouncing"])    # PromptEmbeds
text.embeds  # (1, text_len, text_dim) float32, zero past the prompt's end
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax.checkpoint import open_checkpoint
from vidax.models import umt5
from vidax.models.registry import ModelSpec
from vidax.models.weights import cached_text_encoder, load_text_encoder
from vidax.text.encode import encode_prompts_with_lengths
from vidax.text.hashed import HashedTextEmbedder


@dataclasses.dataclass(frozen=True)
class PromptEmbeds:
    """Text conditioning before a family shapes it (`conditioning` of its package).

    embeds: (b, s, d) token embeddings, zero past each prompt's end; mask: (b, s) bool;
    pooled: (b, p) pooled embedding for families that use one (HunyuanVideo), else None.
    """

    embeds: jax.Array
    mask: jax.Array
    pooled: jax.Array | None = None

    @property
    def batch(self) -> int:
        return self.embeds.shape[0]

    def empty(self) -> PromptEmbeds:
        """All padding, shaped like these: an empty negative prompt."""
        return jax.tree.map(jnp.zeros_like, self)


jax.tree_util.register_dataclass(
    PromptEmbeds, data_fields=["embeds", "mask", "pooled"], meta_fields=[]
)


def embed_prompts(
    spec: ModelSpec,
    prompts: list[str],
    checkpoint: str | os.PathLike | None = None,
    *,
    text_encoder=None,
    random_weights: bool = False,
) -> PromptEmbeds:
    """Prompt embeddings with the spec's text encoder.

    "hashed" presets use the built-in embedder, then (where `spec.text_config` is set) the
    trained `WordEncoder`: `text_encoder` if given (built, or the path of its weights), else
    `load_text_encoder` (with `random_weights`). Wan presets use umT5 when `checkpoint` (or a
    `text_encoder` path) is a diffusers pipeline folder with `text_encoder/` and `tokenizer/`.
    Other encoders (LLaVA, Qwen) are not ported: pass precomputed embeddings
    (`load_prompt_embeds`). Prompts are embedded as written (generation entry points first
    read them into a model's caption grammar: `vidax.data.read_prompt`).
    """
    c = spec.config
    if spec.text_encoder == "hashed":
        if spec.text_config is not None:
            t = spec.text_config
            words, mask = HashedTextEmbedder(dim=t.in_dim, text_len=t.text_len)(prompts)
            if isinstance(text_encoder, str | os.PathLike):
                text_encoder = cached_text_encoder(text_encoder, t)
            encoder = text_encoder or load_text_encoder(
                spec, checkpoint, random_weights=random_weights
            )
            embeds = _compiled_text(nnx.graphdef(encoder))(
                nnx.state(encoder), jnp.asarray(words), jnp.asarray(mask)
            )
            return PromptEmbeds(embeds, jnp.asarray(mask), None)
        embeds, mask = HashedTextEmbedder(dim=c.text_dim, text_len=c.text_len)(prompts)
        pooled = None
        pooled_dim = getattr(c, "pooled_dim", None)
        if pooled_dim is not None:  # a pooled vector: mean of the words' embeddings
            words, wmask = HashedTextEmbedder(dim=pooled_dim, text_len=c.text_len)(prompts)
            count = np.maximum(wmask.sum(1, keepdims=True), 1)
            pooled = jnp.asarray((words * wmask[..., None]).sum(1) / count, jnp.float32)
        return PromptEmbeds(jnp.asarray(embeds), jnp.asarray(mask), pooled)
    source = text_encoder if isinstance(text_encoder, str | os.PathLike) else checkpoint
    if spec.text_encoder.startswith("umt5") and source is not None:
        folders = _umt5_folders(Path(source))
        if folders is not None:
            return _umt5_embeds(spec, prompts, *folders)
    raise ValueError(
        f"model {spec.name!r} needs its text encoder ({spec.text_encoder}): pass a diffusers "
        "pipeline folder with text_encoder/ and tokenizer/ (umT5 only) or precomputed prompt "
        "embeddings (--prompt-embeds)"
    )


class PromptEmbedder:
    """`HashedTextEmbedder`'s call for any "hashed" preset: captions -> (embeds, mask) numpy
    arrays through the preset's whole text path (the trained `WordEncoder` where it has one),
    for training loops that condition on captions.

        embeds, mask = PromptEmbedder(get("tiny"))(["a red circle moving left"])

    Args:
      spec: the model whose text conditioning to produce.
      text_encoder: its built encoder or weights path (default: the shipped weights).
    """

    def __init__(self, spec: ModelSpec, text_encoder=None):
        if spec.text_encoder != "hashed":
            raise ValueError(
                f"PromptEmbedder embeds captions on the fly for 'hashed' text encoders, and "
                f"{spec.name!r} uses {spec.text_encoder!r}"
            )
        self.spec = spec
        if spec.text_config is not None and text_encoder is None:
            text_encoder = load_text_encoder(spec)
        self.text_encoder = text_encoder

    def __call__(self, prompts: str | list[str]) -> tuple[np.ndarray, np.ndarray]:
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        text = embed_prompts(self.spec, prompts, text_encoder=self.text_encoder)
        mask = np.asarray(text.mask)
        return np.asarray(text.embeds, np.float32) * mask[..., None], mask


@functools.lru_cache(maxsize=4)
def _compiled_text(graphdef):
    return jax.jit(lambda state, words, mask: nnx.merge(graphdef, state)(words, mask))


def _umt5_folders(path: Path) -> tuple[Path, Path] | None:
    """(text encoder folder, tokenizer folder) of a pipeline folder or of a text_encoder folder
    with its tokenizer inside or beside it; None if `path` holds no text encoder."""
    if (path / "text_encoder").is_dir():
        return path / "text_encoder", path / "tokenizer"
    if (path / "config.json").is_file():
        inside = any((path / f).is_file() for f in ("tokenizer.json", "spiece.model"))
        return path, path if inside else path.parent / "tokenizer"
    return None


def _umt5_embeds(
    spec: ModelSpec, prompts: list[str], encoder_dir: Path, tokenizer_dir: Path
) -> PromptEmbeds:
    config_file = encoder_dir / "config.json"
    if config_file.exists():
        config = umt5.from_hf_config(json.loads(config_file.read_text()), dtype="float32")
    else:
        config = umt5.PRESETS[spec.text_encoder]
    if config.d_model != spec.config.text_dim:
        raise ValueError(
            f"text encoder width {config.d_model} != transformer text_dim {spec.config.text_dim}"
        )
    encoder = _cached_umt5(str(encoder_dir), config)
    tokenizer = umt5.Tokenizer(tokenizer_dir)
    embeds, lengths = encode_prompts_with_lengths(
        encoder, tokenizer, prompts, max_length=spec.config.text_len
    )
    mask = np.arange(spec.config.text_len)[None] < lengths[:, None]
    return PromptEmbeds(jnp.asarray(embeds), jnp.asarray(mask))


@functools.lru_cache(maxsize=2)
def _cached_umt5(path: str, config):
    return umt5.load(path, config)


def load_prompt_embeds(
    path: str | os.PathLike, spec: ModelSpec
) -> tuple[PromptEmbeds, PromptEmbeds | None]:
    """Reads precomputed prompt embeddings, fitted to the model's text length.

    `.npy`: (b, s, d) or (s, d) embeddings. `.safetensors`: `prompt_embeds` and optionally
    `prompt_mask`, `pooled_prompt_embeds` and the same with a `negative_` prefix.

    Returns (prompt, negative prompt or None).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt embeddings not found: {path}")
    if path.suffix == ".npy":
        arrays = {"prompt_embeds": np.load(path)}
    elif path.suffix == ".safetensors":
        reader = open_checkpoint(path)
        if "prompt_embeds" not in reader:
            raise ValueError(f"{path}: expected a 'prompt_embeds' tensor, found {sorted(reader)}")
        arrays = {k: np.asarray(reader[k]) for k in reader}
    else:
        raise ValueError(f"{path}: prompt embeddings must be .npy or .safetensors")

    def read(prefix: str) -> PromptEmbeds:
        return fit_prompt_embeds(
            spec,
            arrays[f"{prefix}prompt_embeds"],
            arrays.get(f"{prefix}prompt_mask"),
            arrays.get(f"{prefix}pooled_prompt_embeds"),
            source=str(path),
        )

    negative = read("negative_") if "negative_prompt_embeds" in arrays else None
    return read(""), negative


def fit_prompt_embeds(
    spec: ModelSpec, embeds, mask=None, pooled=None, *, source: str = "prompt_embeds"
) -> PromptEmbeds:
    """Validates (b, s, d) or (s, d) embeddings (or `PromptEmbeds`) and pads/truncates them to
    `text_len`.

    Without a mask, rows that are entirely zero count as padding.
    """
    if isinstance(embeds, PromptEmbeds):
        embeds, mask, pooled = embeds.embeds, embeds.mask, embeds.pooled
    c = spec.config
    x = np.asarray(embeds, np.float32)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.shape[-1] != c.text_dim:
        raise ValueError(f"{source}: prompt embeddings must be (b, s, {c.text_dim}), got {x.shape}")
    m = (
        np.any(x != 0, axis=-1)
        if mask is None
        else np.asarray(mask).astype(bool).reshape(x.shape[:2])
    )
    s = min(x.shape[1], c.text_len)
    out = np.zeros((x.shape[0], c.text_len, c.text_dim), np.float32)
    out_mask = np.zeros((x.shape[0], c.text_len), bool)
    out[:, :s], out_mask[:, :s] = x[:, :s], m[:, :s]
    out *= out_mask[..., None]
    if pooled is not None:
        pooled = np.asarray(pooled, np.float32).reshape(x.shape[0], -1)
        if pooled.shape[-1] != getattr(c, "pooled_dim", -1):
            raise ValueError(f"{source}: pooled embeddings of shape {pooled.shape} do not fit")
        pooled = jnp.asarray(pooled)
    return PromptEmbeds(jnp.asarray(out), jnp.asarray(out_mask), pooled)
