"""An on-disk cache of prompt embeddings, so a repeated prompt costs a file read, not an encoder pass.

Entries are keyed by a hash of everything the embedding depends on: the prompt, the encoder
(its config and a fingerprint of its weights, or an identity the caller names), the tokenizer
file, `max_length` and prompt cleaning. Each entry stores only the prompt's true-length rows
(float32 `.npy`), and is written atomically, so concurrent runs can share a directory; an
unreadable entry counts as a miss and is rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np
from flax import nnx

from vidax.checkpoint import write_atomic
from vidax.text import encode as _encode

_FORMAT = 1  # bump when the stored layout or the embedding computation changes
_SAMPLE = 8  # leading entries per axis of each parameter that go into the weight fingerprint


class ConfiguredModule(Protocol):
    """A module built from a config (`UMT5Encoder`, `WordEncoder`), which it keeps."""

    @property
    def config(self) -> Any: ...


def encoder_fingerprint(encoder: ConfiguredModule) -> str:
    """A cheap hash identifying an encoder: its class, config and a corner of every parameter.

    Different checkpoints (or random initialisations) differ in these samples, while hashing
    whole multi-GB tables on every call would not be cheap. Pass an explicit identity to
    `PromptCache.encode` when weights may differ only outside the sampled corner.
    """
    digest = hashlib.sha256(f"{type(encoder).__qualname__}|{encoder.config!r}".encode())
    state = nnx.state(encoder, nnx.Param)
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    for path, leaf in leaves:
        corner = leaf[tuple(slice(0, _SAMPLE) for _ in range(leaf.ndim))]
        value = np.asarray(jax.device_get(corner), np.float32)
        digest.update(f"{jax.tree_util.keystr(path)}{leaf.shape}{leaf.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


class PromptCache:
    """Prompt embeddings cached under `directory` (created if needed).

    `hits` and `misses` count prompts served from disk and prompts encoded.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0

    def key(
        self,
        prompt: str,
        *,
        encoder_identity: str,
        tokenizer_identity: str,
        max_length: int,
        clean: bool,
    ) -> str:
        """The hex digest naming one entry."""
        fields = {
            "format": _FORMAT,
            "prompt": prompt,
            "encoder": encoder_identity,
            "tokenizer": tokenizer_identity,
            "max_length": max_length,
            "clean": clean,
        }
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def encode(
        self,
        encoder,
        tokenizer,
        prompts: str | list[str],
        max_length: int = 512,
        *,
        clean: bool = True,
        encoder_identity: str | None = None,
    ) -> np.ndarray:
        """`vidax.text.encode_prompts`, reading cached prompts and encoding only the others.

        Args:
          encoder, tokenizer, prompts, max_length, clean: as for `encode_prompts`.
          encoder_identity: names the encoder's weights in the key (e.g. a checkpoint path and
            version); default `encoder_fingerprint(encoder)`.

        Returns:
          (b, max_length, d) float32 embeddings, zero past each prompt's true length.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if max_length < 1:
            raise ValueError(f"max_length must be positive, got {max_length}")
        identity = encoder_identity or encoder_fingerprint(encoder)
        keys = [
            self.key(
                p,
                encoder_identity=identity,
                tokenizer_identity=tokenizer.identity,
                max_length=max_length,
                clean=clean,
            )
            for p in prompts
        ]
        d = encoder.config.d_model
        found: dict[str, np.ndarray] = {}
        for key in dict.fromkeys(keys):
            entry = self._read(key, max_length, d)
            if entry is not None:
                found[key] = entry
        todo = {key: p for key, p in zip(keys, prompts, strict=True) if key not in found}
        if todo:
            embeddings, lengths = _encode.encode_prompts_with_lengths(
                encoder, tokenizer, list(todo.values()), max_length, clean=clean
            )
            for key, emb, n in zip(todo, embeddings, lengths, strict=True):
                found[key] = emb[:n]
                self._write(key, emb[:n])
        self.misses += len(todo)
        self.hits += len(prompts) - len(todo)
        out = np.zeros((len(prompts), max_length, d), np.float32)
        for row, key in enumerate(keys):
            out[row, : len(found[key])] = found[key]
        return out

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.npy"

    def _read(self, key: str, max_length: int, d: int) -> np.ndarray | None:
        try:
            value = np.load(self._path(key), allow_pickle=False)
        except (OSError, ValueError, EOFError):  # absent, truncated or not an .npy file
            return None
        if value.dtype != np.float32 or value.ndim != 2 or value.shape[1] != d:
            return None
        if not 1 <= value.shape[0] <= max_length:
            return None
        return value

    def _write(self, key: str, value: np.ndarray) -> None:
        value = np.ascontiguousarray(value, np.float32)
        write_atomic(self._path(key), lambda tmp: np.save(tmp, value))
