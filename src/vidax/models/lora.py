"""LoRA adapters for the video transformers, merged into the loaded weights (and un-merged).

A LoRA file holds, for some weights W of a transformer, factors A (rank x in) and B
(out x rank) and optionally alpha; the adapted weight is

    W + scale * alpha / rank * B @ A        (alpha = rank when the file gives none, as in PEFT)

`merge_loras` adds that delta to the parameters of a loaded vidax transformer (accumulated in
float32, cast back to the parameter dtype); `unmerge_loras` subtracts the same delta. Each file
key is mapped onto a diffusers parameter name, then onto the vidax parameter through the
family's key map (`key_map` in its `convert.py`), whose transform converts the delta as it
converts the weight (a Linear's transpose, the patch embedding's Conv3d reshape).

Key formats (the prefix says which names to expect; without one, the names that fit every key):
  diffusers / PEFT: `transformer.blocks.0.attn1.to_q.lora_A.weight` / `.lora_B.weight` (prefix
    optional; `lora_down`/`lora_up` and `lora.down`/`lora.up` too). Alpha is a `<module>.alpha`
    tensor, else the `lora_adapter_metadata` diffusers' `save_lora_weights` writes (PEFT's `r`,
    `lora_alpha`, `rank_pattern`, `alpha_pattern`, `use_rslora`), else the rank.
    `lora_B.bias` (PEFT's `lora_bias`) changes the bias by scale * alpha / rank * bias.
  ComfyUI / original checkpoints: `diffusion_model.blocks.0.self_attn.q.lora_down.weight`,
    `.lora_up.weight`, `.alpha`, in the names of the Wan and HunyuanVideo reference code, and
    kohya/musubi's `lora_unet_blocks_0_self_attn_q.lora_down.weight` spelling of them.
    HunyuanVideo's fused projections (`img_attn_qkv`, `txt_attn_qkv`, the refiner's
    `self_attn_qkv`, the single blocks' `linear1`) are split by output rows as diffusers splits
    the weights, and `final_layer.adaLN_modulation.1` has its (shift, scale) halves swapped.
  Full deltas: `<module>.diff` (the weight) and `.diff_b` (the bias), added times the scale
    with no alpha, as ComfyUI adds them (diffusers drops the norms' ones, which are zero in the
    files that have them).

Anything else is a one-line `CheckpointError` naming the file and key: a key that maps to no
weight of the transformer, DoRA/LoHa/LoKr tensors, shapes or ranks that do not fit, NaN/inf.
Every file is read and checked before any weight changes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax.checkpoint import CheckpointError, CheckpointReader, Rule, open_checkpoint

if TYPE_CHECKING:
    from vidax.models.registry import ModelSpec


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """One LoRA file and the scale its delta is added with."""

    path: Path
    scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))
        if not math.isfinite(self.scale):
            raise ValueError(f"LoRA {self.path}: scale {self.scale} is not a finite number")

    @classmethod
    def of(cls, lora: LoraLike) -> LoraSpec:
        """`lora` as a spec: a spec as it is, a path with scale 1, a string `parse`d."""
        if isinstance(lora, LoraSpec):
            return lora
        return cls(Path(lora)) if isinstance(lora, os.PathLike) else cls.parse(lora)

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """`FILE` or `FILE:SCALE` (e.g. `style.safetensors:0.8`); the scale defaults to 1."""
        path, sep, scale = text.rpartition(":")
        if sep and path:
            try:
                value = float(scale)
            except ValueError:
                if not Path(text).exists() and Path(path).exists():
                    raise ValueError(
                        f"--lora {text!r}: scale {scale!r} is not a number (FILE[:SCALE])"
                    ) from None
            else:
                return cls(Path(path), value)
        return cls(Path(text))


# What the functions take for a LoRA: a spec, a "FILE[:SCALE]" string, or a path (scale 1).
LoraLike = LoraSpec | str | os.PathLike


def merge_loras(transformer: nnx.Module, spec: ModelSpec, loras: Iterable[LoraLike]) -> None:
    """Adds the LoRAs' deltas to `transformer`'s weights, in place.

    Args:
      transformer: a loaded vidax transformer of `spec`'s family and config. Its changed
        parameter arrays are donated (replaced by new ones, on the same devices and shardings).
      spec: its `vidax.models.registry.ModelSpec`.
      loras: `LoraSpec`s, "FILE[:SCALE]" strings or paths (scale 1); their deltas add up.

    Raises:
      FileNotFoundError: a LoRA file does not exist.
      CheckpointError: a file that is no LoRA, or does not fit this transformer (one line
        naming the file and key); then no weight has changed.
    """
    _apply(transformer, spec, loras, sign=1.0)


def unmerge_loras(transformer: nnx.Module, spec: ModelSpec, loras: Iterable[LoraLike]) -> None:
    """Subtracts what `merge_loras` with the same arguments added (exact up to the rounding of
    the parameter dtype)."""
    _apply(transformer, spec, loras, sign=-1.0)


def _apply(transformer: nnx.Module, spec, loras: Iterable[LoraLike], sign: float) -> None:
    adapters = [LoraSpec.of(lora) for lora in loras]
    params = {
        ".".join(str(k) for k in path): variable
        for path, variable in nnx.to_flat_state(nnx.state(transformer, nnx.Param))
    }
    weights = _Weights(spec.family, _key_map(spec), params)
    changes: dict[tuple[str, int | None], list[tuple[_Delta, float]]] = defaultdict(list)
    for lora in adapters:  # read and check everything before changing anything
        for delta in _read(lora.path, weights):
            changes[delta.rule.target, delta.layer].append((delta, sign * lora.scale))
    for (target, layer), items in changes.items():
        rule = items[0][0].rule
        total = np.zeros(weights.shape(rule), np.float32)  # checkpoint layout
        for delta, scale in items:
            total += delta.dense() * np.float32(scale)
        if rule.transform is not None:
            total = rule.transform(total)
        variable = params[target]
        value = variable.get_value()
        sharding = value.sharding
        value = _add(value, total) if layer is None else _add_layer(value, np.int32(layer), total)
        variable.set_value(jax.device_put(value, sharding))


@functools.partial(jax.jit, donate_argnums=0)
def _add(value: jax.Array, delta: jax.Array) -> jax.Array:
    return (value.astype(jnp.float32) + delta).astype(value.dtype)


@functools.partial(jax.jit, donate_argnums=0)
def _add_layer(value: jax.Array, layer: jax.Array, delta: jax.Array) -> jax.Array:
    """`value[layer] += delta` of a stacked parameter, one layer at a time: no stacked delta."""
    new = jax.lax.dynamic_index_in_dim(value, layer, keepdims=False).astype(jnp.float32) + delta
    return jax.lax.dynamic_update_index_in_dim(value, new.astype(value.dtype), layer, 0)


def _key_map(spec) -> list[Rule]:
    return spec.family_module.key_map(spec.config)


# ---------------------------------------------------------------------------------------------
# Reading a file into deltas on diffusers-named weights.


@dataclasses.dataclass(frozen=True)
class _Delta:
    """One additive change to one (layer of a) weight, in the checkpoint layout."""

    key: str  # the LoRA file key it comes from, for messages
    rule: Rule  # the key-map rule of the weight
    layer: int | None  # the layer of a stacked weight
    up: np.ndarray  # B, (out, rank, 1, ...); without `down`, the whole delta
    down: np.ndarray | None  # A, (rank, in, ...)
    factor: float  # alpha / rank (1 for a full delta)

    def dense(self) -> np.ndarray:
        """factor * B @ A (or factor * delta), float32, in the weight's checkpoint layout."""
        if self.down is None:
            return self.up * np.float32(self.factor)
        rank = self.down.shape[0]
        product = self.up.reshape(-1, rank) @ self.down.reshape(rank, -1)
        return (product * np.float32(self.factor)).reshape(self.up.shape[0], *self.down.shape[1:])


# Key suffix -> what the tensor is (`.diff_b` before `.diff`).
_KINDS = (
    (".lora_A.weight", "down"),
    (".lora_down.weight", "down"),
    (".lora.down.weight", "down"),
    (".lora_B.weight", "up"),
    (".lora_up.weight", "up"),
    (".lora.up.weight", "up"),
    (".lora_B.bias", "up_bias"),
    (".alpha", "alpha"),
    (".diff_b", "diff_b"),
    (".diff", "diff"),
)
# Key prefix -> separator of its module names, and the namings to try, in order, for a file's
# keys with that prefix (the first that names every key is used).
_PREFIXES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("transformer.", ".", ("diffusers", "original")),
    ("base_model.model.", ".", ("diffusers", "original")),
    ("model.diffusion_model.", ".", ("original", "diffusers")),
    ("diffusion_model.", ".", ("original", "diffusers")),
    ("lora_unet_", "_", ("original", "diffusers")),
    ("lora_transformer_", "_", ("diffusers", "original")),
    ("", ".", ("diffusers", "original")),
)
# PEFT options that change what the factors mean (vidax merges plain LoRA only).
_PEFT_UNSUPPORTED = (
    "use_dora",
    "use_qalora",
    "use_bdlora",
    "fan_in_fan_out",
    "target_parameters",
    "alora_invocation_tokens",
    "layer_replication",
    "arrow_config",
    "kasa_config",
    "monteclora_config",
)


@dataclasses.dataclass(frozen=True)
class _Alias:
    """The diffusers module(s) a module name stands for: several for a fused projection, whose
    output rows are split among them in order; `swap` exchanges the two halves of the rows
    first (the reference's (shift, scale) modulation is diffusers' (scale, shift))."""

    diffusers: tuple[str, ...]
    swap: bool = False


def _wan_names() -> dict[str, _Alias]:
    """Wan-AI reference (and ComfyUI) module names -> diffusers `WanTransformer3DModel`'s, as
    diffusers' scripts/convert_wan_to_diffusers.py renames the weights."""
    names = {
        "patch_embedding": "patch_embedding",
        "text_embedding.0": "condition_embedder.text_embedder.linear_1",
        "text_embedding.2": "condition_embedder.text_embedder.linear_2",
        "time_embedding.0": "condition_embedder.time_embedder.linear_1",
        "time_embedding.2": "condition_embedder.time_embedder.linear_2",
        "time_projection.1": "condition_embedder.time_proj",
        "head.head": "proj_out",
        "head.modulation": "scale_shift_table",
        "blocks.{i}.modulation": "blocks.{i}.scale_shift_table",
        # The reference's cross-attention norm is norm3 (its norm2, before the FFN, has no
        # weights); diffusers calls it norm2.
        "blocks.{i}.norm3": "blocks.{i}.norm2",
        "blocks.{i}.ffn.0": "blocks.{i}.ffn.net.0.proj",
        "blocks.{i}.ffn.2": "blocks.{i}.ffn.net.2",
    }
    for ours, theirs in (("self_attn", "attn1"), ("cross_attn", "attn2")):
        for o, d in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0")):
            names[f"blocks.{{i}}.{ours}.{o}"] = f"blocks.{{i}}.{theirs}.{d}"
        for norm in ("norm_q", "norm_k"):
            names[f"blocks.{{i}}.{ours}.{norm}"] = f"blocks.{{i}}.{theirs}.{norm}"
    return {k: _Alias((v,)) for k, v in names.items()}


def _hunyuan_names() -> dict[str, _Alias]:
    """HunyuanVideo reference (and ComfyUI) module names -> diffusers
    `HunyuanVideoTransformer3DModel`'s, as diffusers' convert_hunyuan_video_to_diffusers.py
    renames and splits the weights."""
    names: dict[str, tuple[str, ...] | str] = {
        "img_in.proj": "x_embedder.proj",
        "time_in.mlp.0": "time_text_embed.timestep_embedder.linear_1",
        "time_in.mlp.2": "time_text_embed.timestep_embedder.linear_2",
        "guidance_in.mlp.0": "time_text_embed.guidance_embedder.linear_1",
        "guidance_in.mlp.2": "time_text_embed.guidance_embedder.linear_2",
        "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
        "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
        "txt_in.input_embedder": "context_embedder.proj_in",
        "txt_in.t_embedder.mlp.0": "context_embedder.time_text_embed.timestep_embedder.linear_1",
        "txt_in.t_embedder.mlp.2": "context_embedder.time_text_embed.timestep_embedder.linear_2",
        "txt_in.c_embedder.linear_1": "context_embedder.time_text_embed.text_embedder.linear_1",
        "txt_in.c_embedder.linear_2": "context_embedder.time_text_embed.text_embedder.linear_2",
        "final_layer.linear": "proj_out",
    }
    r = "txt_in.individual_token_refiner.blocks.{i}"
    rd = "context_embedder.token_refiner.refiner_blocks.{i}"
    names |= {
        f"{r}.self_attn_qkv": tuple(f"{rd}.attn.{p}" for p in ("to_q", "to_k", "to_v")),
        f"{r}.self_attn_proj": f"{rd}.attn.to_out.0",
        f"{r}.mlp.fc1": f"{rd}.ff.net.0.proj",
        f"{r}.mlp.fc2": f"{rd}.ff.net.2",
        f"{r}.adaLN_modulation.1": f"{rd}.norm_out.linear",
        f"{r}.norm1": f"{rd}.norm1",
        f"{r}.norm2": f"{rd}.norm2",
    }
    d, dd = "double_blocks.{i}", "transformer_blocks.{i}"
    names |= {
        f"{d}.img_attn_qkv": tuple(f"{dd}.attn.{p}" for p in ("to_q", "to_k", "to_v")),
        f"{d}.txt_attn_qkv": tuple(
            f"{dd}.attn.{p}" for p in ("add_q_proj", "add_k_proj", "add_v_proj")
        ),
        f"{d}.img_attn_proj": f"{dd}.attn.to_out.0",
        f"{d}.txt_attn_proj": f"{dd}.attn.to_add_out",
        f"{d}.img_attn_q_norm": f"{dd}.attn.norm_q",
        f"{d}.img_attn_k_norm": f"{dd}.attn.norm_k",
        f"{d}.txt_attn_q_norm": f"{dd}.attn.norm_added_q",
        f"{d}.txt_attn_k_norm": f"{dd}.attn.norm_added_k",
        f"{d}.img_mod.linear": f"{dd}.norm1.linear",
        f"{d}.txt_mod.linear": f"{dd}.norm1_context.linear",
        f"{d}.img_mlp.fc1": f"{dd}.ff.net.0.proj",
        f"{d}.img_mlp.fc2": f"{dd}.ff.net.2",
        f"{d}.txt_mlp.fc1": f"{dd}.ff_context.net.0.proj",
        f"{d}.txt_mlp.fc2": f"{dd}.ff_context.net.2",
    }
    s, sd = "single_blocks.{i}", "single_transformer_blocks.{i}"
    names |= {
        f"{s}.linear1": tuple(
            f"{sd}.{p}" for p in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")
        ),
        f"{s}.linear2": f"{sd}.proj_out",
        f"{s}.q_norm": f"{sd}.attn.norm_q",
        f"{s}.k_norm": f"{sd}.attn.norm_k",
        f"{s}.modulation.linear": f"{sd}.norm.linear",
    }
    aliases = {k: _Alias(v if isinstance(v, tuple) else (v,)) for k, v in names.items()}
    aliases["final_layer.adaLN_modulation.1"] = _Alias(("norm_out.linear",), swap=True)
    return aliases


# family -> the reference code's module names (families without: diffusers names only).
_ORIGINAL_NAMES = {"wan": _wan_names, "hunyuanvideo": _hunyuan_names}


class _Weights:
    """The transformer's weights by diffusers name, and the module names LoRA keys may use."""

    def __init__(self, family: str, rules: list[Rule], params: dict[str, nnx.Variable]):
        self.family = family
        self.params = params
        self.rules = {rule.source: rule for rule in rules}
        modules = {
            s.rsplit(".", 1)[0] if s.endswith((".weight", ".bias")) else s for s in self.rules
        }
        self.names = {
            "diffusers": {m: _Alias((m,)) for m in modules},
            "original": _ORIGINAL_NAMES[family]() if family in _ORIGINAL_NAMES else {},
        }
        # Module templates as a file spells them ("blocks_{i}_self_attn_q" for "_").
        self.spelled: dict[tuple[str, str], dict[str, list[str]]] = {}
        for naming, names in self.names.items():
            for sep in (".", "_"):
                spelled = self.spelled[naming, sep] = defaultdict(list)
                for template in names:
                    spelled[template.replace(".", sep)].append(template)
        self._shapes: dict[str, tuple[int, ...]] = {}

    def find(self, key: str) -> tuple[Rule, int | None] | None:
        """The rule and layer of diffusers parameter `key`, or None."""
        rule = self.rules.get(key)
        if rule is not None and not rule.stacked:
            return rule, None
        for template, layer in _templates(key, "."):
            rule = self.rules.get(template)
            if rule is not None and rule.stacked and layer < self.layers(rule):
                return rule, layer
        return None

    def layers(self, rule: Rule) -> int:
        return self.params[rule.target].get_value().shape[0]

    def shape(self, rule: Rule) -> tuple[int, ...]:
        """The checkpoint-layout shape of one layer of `rule`'s weight."""
        if rule.source not in self._shapes:
            shape = self.params[rule.target].get_value().shape
            layer = jax.ShapeDtypeStruct(shape[1:] if rule.stacked else shape, np.float32)
            if rule.transform is not None:
                if rule.inverse is None:
                    raise ValueError(f"key-map rule for {rule.source!r} has no inverse transform")
                layer = jax.eval_shape(rule.inverse, layer)
            self._shapes[rule.source] = tuple(layer.shape)
        return self._shapes[rule.source]

    def resolve(self, module: str, naming: str, sep: str) -> list[_Alias]:
        """What `module` (as written, without prefix) can name: one alias, none, or (for an
        ambiguous underscore spelling) several."""
        spelled = self.spelled[naming, sep]
        found = {}
        for name, layer in [(module, None), *_templates(module, sep)]:
            for template in spelled.get(name, ()):
                if ("{i}" in template) == (layer is not None):
                    alias = self.names[naming][template]
                    found[template.format(i=layer)] = dataclasses.replace(
                        alias, diffusers=tuple(d.format(i=layer) for d in alias.diffusers)
                    )
        return list(found.values())


def _templates(name: str, sep: str) -> Iterator[tuple[str, int]]:
    """`name` with one numeric part replaced by "{i}", and that number, for each such part."""
    parts = name.split(sep)
    for n, part in enumerate(parts):
        if part.isdigit():
            yield sep.join([*parts[:n], "{i}", *parts[n + 1 :]]), int(part)


def _read(path: Path, weights: _Weights) -> list[_Delta]:
    """The deltas of the LoRA file at `path` (checked, not scaled)."""
    if not path.is_file():
        raise FileNotFoundError(f"LoRA not found: {path}")
    reader = open_checkpoint(path)
    groups: dict[str, dict[str, str]] = defaultdict(dict)  # module as written -> kind -> key
    unsupported = []
    for key in reader:
        kind = next(((k, key[: -len(s)]) for s, k in _KINDS if key.endswith(s)), None)
        if kind is None:
            unsupported.append(key)
        else:
            groups[kind[1]][kind[0]] = key
    if not groups:
        raise CheckpointError(
            f"{path}: not a LoRA file in a known format (no lora_A/lora_B, lora_down/lora_up or "
            f".diff keys; first key {next(iter(reader), None)!r})"
        )
    if unsupported:
        raise CheckpointError(
            f"{path}: unsupported LoRA keys {unsupported[:3]}"
            + (f" and {len(unsupported) - 3} more" if len(unsupported) > 3 else "")
            + " (vidax merges LoRA A/B factors, alpha, .diff and .diff_b; not DoRA, LoHa, LoKr)"
        )
    peft = _peft_config(reader, path)
    deltas = []
    for (prefix, sep, naming), modules in _namings(groups, weights).items():
        if peft is not None and naming != "diffusers":
            raise CheckpointError(f"{path}: lora_adapter_metadata with non-diffusers names")
        for module in modules:
            kinds = groups[prefix + module]
            aliases = weights.resolve(module, naming, sep)
            key = next(iter(kinds.values()))
            if not aliases:
                raise CheckpointError(
                    f"{path}: LoRA key {key!r} maps to no weight of the {weights.family} "
                    "transformer"
                )
            if len(aliases) > 1:
                names = [a.diffusers[0] for a in aliases]
                raise CheckpointError(f"{path}: LoRA key {key!r} is ambiguous: it can be {names}")
            (alias,) = aliases
            tensors = {kind: _tensor(reader, k, path) for kind, k in kinds.items()}
            deltas += _module_deltas(path, kinds, tensors, alias, weights, peft)
    return deltas


def _namings(groups, weights: _Weights) -> dict[tuple[str, str, str], list[str]]:
    """The modules of `groups` (as written) by (prefix, separator, naming)."""
    by_prefix: dict[tuple[str, str, tuple[str, ...]], list[str]] = defaultdict(list)
    for written in groups:
        prefix, sep, namings = next(p for p in _PREFIXES if written.startswith(p[0]))
        by_prefix[prefix, sep, namings].append(written[len(prefix) :])
    out = {}
    for (prefix, sep, namings), modules in by_prefix.items():
        naming = next(
            (n for n in namings if all(weights.resolve(m, n, sep) for m in modules)), namings[0]
        )
        out[prefix, sep, naming] = modules
    return out


def _tensor(reader: CheckpointReader, key: str, path: Path) -> np.ndarray:
    value = reader[key]
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise CheckpointError(f"{path}: tensor {key!r} has dtype {value.dtype}, not floating")
    value = np.asarray(value, np.float32)
    if not np.isfinite(value).all():
        raise CheckpointError(f"{path}: tensor {key!r} has non-finite values (NaN or inf)")
    return value


def _module_deltas(path, keys, tensors, alias, weights, peft) -> list[_Delta]:
    """The deltas of one LoRA module: its factors (and bias), and its full deltas."""
    deltas = []
    down, up = tensors.get("down"), tensors.get("up")
    if down is None or up is None:
        for kind in ("down", "up", "alpha", "up_bias"):
            if kind in keys:
                raise CheckpointError(
                    f"{path}: {keys[kind]!r} without its "
                    + ("lora_A/lora_down" if down is None else "lora_B/lora_up")
                    + " tensor"
                )
    else:
        rank = down.shape[0]
        # A Linear's B is (out, rank); a Conv's is (out, rank, 1, ...), a 1x1 kernel.
        conv_ok = up.ndim == down.ndim and all(n == 1 for n in up.shape[2:])
        if up.ndim < 2 or up.shape[1] != rank or not conv_ok:
            raise CheckpointError(
                f"{path}: rank mismatch: {keys['down']!r} {down.shape} and {keys['up']!r} "
                f"{up.shape} (want A (rank, in, ...) and B (out, rank, 1, ...))"
            )
        factor = _factor(path, keys, tensors, rank, alias, peft)
        deltas += _split(path, keys["up"], up, down, factor, alias, "weight", weights)
        if "up_bias" in tensors:
            bias = tensors["up_bias"]
            deltas += _split(path, keys["up_bias"], bias, None, factor, alias, "bias", weights)
    if "diff" in tensors:
        deltas += _split(path, keys["diff"], tensors["diff"], None, 1.0, alias, "weight", weights)
    if "diff_b" in tensors:
        diff_b = tensors["diff_b"]
        deltas += _split(path, keys["diff_b"], diff_b, None, 1.0, alias, "bias", weights)
    return deltas


def _factor(path, keys, tensors, rank: int, alias: _Alias, peft) -> float:
    """alpha / rank: from the file's alpha tensor, else its PEFT config, else 1."""
    if "alpha" in tensors:
        alpha = tensors["alpha"]
        if alpha.size != 1:
            raise CheckpointError(
                f"{path}: {keys['alpha']!r} has shape {alpha.shape}, not a scalar"
            )
        return float(alpha.reshape(())) / rank
    if peft is None:
        return 1.0
    module = alias.diffusers[0]
    rank_pattern = peft.get("rank_pattern") or {}
    alpha_pattern = peft.get("alpha_pattern") or {}
    r = rank_pattern.get(_pattern_key(rank_pattern, module), peft.get("r", rank))
    alpha = alpha_pattern.get(_pattern_key(alpha_pattern, module), peft.get("lora_alpha", r))
    if r != rank:
        raise CheckpointError(
            f"{path}: {keys['down']!r} has rank {rank} but lora_adapter_metadata says r={r}"
        )
    return alpha / (math.sqrt(r) if peft.get("use_rslora") else r)


def _pattern_key(patterns: dict, module: str) -> str:
    """PEFT's `get_pattern_key`: the first pattern matching the end of `module`'s name."""
    return next((p for p in patterns if re.match(rf"(.*\.)?({p})$", module)), module)


def _peft_config(reader: CheckpointReader, path: Path) -> dict | None:
    """The transformer's PEFT `LoraConfig` fields that diffusers saved with the file, or None."""
    raw = reader.files[0].metadata.get("lora_adapter_metadata")
    if raw is None:
        return None
    try:
        metadata = json.loads(raw)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: lora_adapter_metadata is not valid JSON ({e})") from None
    config = {
        k.removeprefix("transformer."): v
        for k, v in metadata.items()
        if k.startswith("transformer.")
    }
    if not config:
        return None
    if config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(f"{path}: PEFT type {config['peft_type']!r} is not LoRA")
    for option in _PEFT_UNSUPPORTED:
        if config.get(option):
            raise CheckpointError(
                f"{path}: PEFT option {option}={config[option]!r} is not supported"
            )
    return config


def _split(path, key, up, down, factor, alias: _Alias, param: str, weights) -> list[_Delta]:
    """`up`'s rows (B's, or a full delta's) given to the diffusers module(s) of `alias`."""
    targets = []
    for module in alias.diffusers:
        names = [f"{module}.{param}"] + ([module] if param == "weight" else [])
        found = next((f for f in map(weights.find, names) if f is not None), None)
        if found is None:
            raise CheckpointError(
                f"{path}: LoRA key {key!r} maps to {names[0]!r}, no weight of the "
                f"{weights.family} transformer"
            )
        targets.append((names[0], *found))
    rows = [weights.shape(rule)[0] for _, rule, _ in targets]
    if len(targets) > 1 and sum(rows) != up.shape[0]:
        raise CheckpointError(
            f"{path}: {key!r} has {up.shape[0]} output rows but "
            f"{', '.join(t[0] for t in targets)} have {rows}"
        )
    deltas, start = [], 0
    for (name, rule, layer), n in zip(targets, rows, strict=True):
        part = up[start : start + n] if len(targets) > 1 else up
        start += n
        got = part.shape if down is None else (part.shape[0], *down.shape[1:])
        want = weights.shape(rule)
        if tuple(got) != want:
            raise CheckpointError(
                f"{path}: {key!r} gives a {tuple(got)} delta for {name!r} of shape {want}"
            )
        if alias.swap:  # shape checked: an even number of rows
            part = np.concatenate(np.split(part, 2)[::-1])
        deltas.append(_Delta(key, rule, layer, part, down, factor))
    return deltas
