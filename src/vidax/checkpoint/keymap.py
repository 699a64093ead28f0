"""Declarative key maps between checkpoint tensors and vidax parameters.

A model family's `convert.py` is a list of `Rule`s. A source key containing ``{i}`` is a
per-layer tensor; its layers are stacked along axis 0 of the (scanned) vidax parameter.

`load_state` validates the whole map against the checkpoint header first (missing,
unexpected and mis-shaped keys, non-float data) so nothing is half-loaded, then streams one
parameter at a time: read (memory-mapped), transform, cast, and `device_put` straight to its
sharding. Peak extra host memory is about one (stacked) parameter. A tensor holding NaN or inf
is an error naming its file and key (a broken checkpoint, not a model to run).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vidax.checkpoint.safetensors import CheckpointError, CheckpointReader

Transform = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One checkpoint tensor (or a family of per-layer tensors) -> one vidax parameter.

    Attributes:
      source: checkpoint key; ``{i}`` marks the layer index of a stacked parameter.
      target: dotted path of the parameter in the vidax model state.
      transform: checkpoint layout -> vidax layout; must use array methods only (`.T`,
        `.reshape`, `.transpose`) so shapes can be checked abstractly before loading.
      inverse: vidax layout -> checkpoint layout, for `export_state`.
    """

    source: str
    target: str
    transform: Transform | None = None
    inverse: Transform | None = None

    @property
    def stacked(self) -> bool:
        return "{i}" in self.source


def transpose(x):
    """torch Linear (out, in) <-> vidax kernel (in, out)."""
    return x.T


LINEAR = {"transform": transpose, "inverse": transpose}


def linear_rules(source: str, target: str, bias: bool = True) -> list[Rule]:
    """Rules for a torch Linear `source` -> vidax `Linear` at `target`."""
    rules = [Rule(f"{source}.weight", f"{target}.kernel", **LINEAR)]
    if bias:
        rules.append(Rule(f"{source}.bias", f"{target}.bias"))
    return rules


def _flat(state: nnx.State) -> dict[str, nnx.Variable]:
    leaves = jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda v: isinstance(v, nnx.Variable)
    )[0]
    return {".".join(str(getattr(k, "key", k)) for k in path): v for path, v in leaves}


def _source_keys(rule: Rule, layers: int) -> list[str]:
    return [rule.source.format(i=i) for i in range(layers)] if rule.stacked else [rule.source]


def load_state(
    abstract_state: nnx.State,
    reader: CheckpointReader,
    rules: Iterable[Rule],
    *,
    shardings: nnx.State | None = None,
    ignore: Iterable[str] = (),
) -> nnx.State:
    """Fills an abstract model state (from `nnx.eval_shape`) with checkpoint tensors.

    Args:
      abstract_state: parameter state whose leaves hold `ShapeDtypeStruct`s.
      reader: an opened checkpoint.
      rules: the family's key map; must cover every parameter exactly once.
      shardings: optional matching state of `jax.sharding.Sharding`s for placement.
      ignore: glob patterns of checkpoint keys that are expected and unused.

    Returns:
      The state with concrete arrays, placed with their shardings.

    Raises:
      CheckpointError: naming every missing, unexpected or mis-shaped key, or the file and key
        of the first tensor with non-finite values.
    """
    rules = list(rules)
    targets = _flat(abstract_state)
    placements = _flat(shardings) if shardings is not None else {}
    errors: list[str] = []
    used: set[str] = set()
    seen_targets: set[str] = set()
    plan: list[tuple[Rule, list[str], jax.ShapeDtypeStruct]] = []
    for rule in rules:
        if rule.target not in targets:
            raise ValueError(f"key map names unknown parameter {rule.target!r}")
        if rule.target in seen_targets:
            raise ValueError(f"key map names parameter {rule.target!r} twice")
        seen_targets.add(rule.target)
        want = targets[rule.target].get_value()
        keys = _source_keys(rule, want.shape[0] if rule.stacked else 1)
        want_one = jax.ShapeDtypeStruct(want.shape[1:] if rule.stacked else want.shape, want.dtype)
        for key in keys:
            if key not in reader:
                errors.append(f"missing key {key!r} (for {rule.target})")
                continue
            used.add(key)
            # jnp.issubdtype knows ml_dtypes' bfloat16 (np.issubdtype calls it not floating).
            if not jnp.issubdtype(reader.dtype(key), jnp.floating) and jnp.issubdtype(
                want.dtype, jnp.floating
            ):
                errors.append(
                    f"key {key!r} in {reader.path_of(key)} has dtype {reader.dtype(key)}, "
                    f"expected floating point"
                )
                continue
            src = jax.ShapeDtypeStruct(reader.shape(key), np.float32)
            try:
                got = jax.eval_shape(rule.transform, src) if rule.transform else src
            except (TypeError, ValueError) as e:
                errors.append(f"key {key!r} has shape {src.shape}: cannot convert ({e})")
                continue
            if got.shape != want_one.shape:
                errors.append(
                    f"key {key!r} in {reader.path_of(key)} has shape {reader.shape(key)} "
                    f"-> {got.shape}, expected {want_one.shape} for {rule.target}"
                )
        if rule.stacked and rule.source.format(i=len(keys)) in reader:
            errors.append(
                f"checkpoint has more layers than the model: {rule.source.format(i=len(keys))!r}"
            )
        plan.append((rule, keys, want))
    uncovered = sorted(set(targets) - seen_targets)
    if uncovered:
        raise ValueError(f"key map does not cover parameters {uncovered}")
    patterns = list(ignore)
    unexpected = sorted(
        k for k in reader if k not in used and not any(fnmatch.fnmatch(k, p) for p in patterns)
    )
    errors += [f"unexpected key {k!r} in {reader.path_of(k)}" for k in unexpected]
    if errors:
        shown = "\n  ".join(errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise CheckpointError(f"checkpoint does not match the model:\n  {shown}{more}")

    values: dict[str, jax.Array] = {}
    for rule, keys, want in plan:
        if rule.stacked:  # fill one host buffer layer by layer: no list of copies
            host = np.empty(want.shape, want.dtype)
            for i, key in enumerate(keys):
                host[i] = _convert(reader[key], rule, want.dtype)
                _check_finite(host[i], reader, key)
        else:
            host = _convert(reader[keys[0]], rule, want.dtype)
            _check_finite(host, reader, keys[0])
        values[rule.target] = jax.device_put(host, placements.get(rule.target))
        del host

    def fill(path, variable):
        name = ".".join(str(getattr(k, "key", k)) for k in path)
        return variable.replace(values[name])

    return jax.tree_util.tree_map_with_path(
        fill, abstract_state, is_leaf=lambda v: isinstance(v, nnx.Variable)
    )


def _convert(array: np.ndarray, rule: Rule, dtype) -> np.ndarray:
    if rule.transform is not None:
        array = rule.transform(array)
    return np.ascontiguousarray(array, dtype=dtype)


def _check_finite(array: np.ndarray, reader: CheckpointReader, key: str) -> None:
    if not jnp.issubdtype(array.dtype, jnp.floating) or np.isfinite(array).all():
        return
    bad = array.size - np.count_nonzero(np.isfinite(array))
    raise CheckpointError(
        f"{reader.path_of(key)}: tensor {key!r} has {bad} non-finite values (NaN or inf) "
        f"of {array.size}"
    )


def export_state(state: nnx.State, rules: Iterable[Rule], dtype=None) -> dict[str, np.ndarray]:
    """Inverse of `load_state`: vidax parameters -> checkpoint-layout numpy tensors."""
    flat = _flat(state)
    out: dict[str, np.ndarray] = {}
    for rule in rules:
        value = np.asarray(jax.device_get(flat[rule.target].get_value()))
        if dtype is not None:
            value = value.astype(dtype)
        if rule.transform is not None and rule.inverse is None:
            raise ValueError(f"rule for {rule.source!r} has no inverse transform")
        layers = value if rule.stacked else [value]
        for key, layer in zip(_source_keys(rule, len(layers)), layers, strict=True):
            out[key] = np.ascontiguousarray(rule.inverse(layer) if rule.inverse else layer)
    return out
