"""Sharding strategies: the one place where logical axis names meet mesh axes.

A `Strategy` holds two short tables, one for parameters and one for activations. Activate one
with `use_mesh(mesh, strategy)`; inside it `shard(x, axes)` constrains activations and
`param_shardings(state)` turns parameter annotations into `NamedSharding`s. Outside any mesh
both are no-ops, so model code runs unchanged on one device.

    with use_mesh(mesh, "fsdp_sp"):
        x = shard(x, ("batch", "tokens", "embed"))
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from vidax.sharding.axes import ACTIVATION_AXES, MESH_AXES, PARAM_AXES

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]


def _as_tuple(mesh_axes: MeshAxes) -> tuple[str, ...]:
    if mesh_axes is None:
        return ()
    return (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Strategy:
    """A named pair of logical->mesh rule tables (parameters, activations)."""

    name: str
    params: Rules = ()
    activations: Rules = ()

    def __post_init__(self):
        for table, vocab in ((self.params, PARAM_AXES), (self.activations, ACTIVATION_AXES)):
            for logical, mesh_axes in table:
                if logical not in vocab:
                    raise ValueError(f"strategy {self.name!r}: unknown logical axis {logical!r}")
                for axis in _as_tuple(mesh_axes):
                    if axis not in MESH_AXES:
                        raise ValueError(f"strategy {self.name!r}: unknown mesh axis {axis!r}")


_BATCH = ("batch", ("data", "fsdp"))
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(name="replicated"),
        # Data parallel over videos (and the CFG pair); weights replicated.
        Strategy(name="dp", activations=(("batch", ("data", "fsdp")),)),
        # Weights sharded over fsdp and gathered per layer; activations split by batch.
        Strategy(
            name="fsdp",
            params=(("embed", "fsdp"),),
            activations=(_BATCH,),
        ),
        # fsdp + sequence parallelism: queries stay split over `seq`, keys/values are gathered.
        Strategy(
            name="fsdp_sp",
            params=(("embed", "fsdp"),),
            activations=(_BATCH, ("tokens", "seq"), ("attn_tokens", "seq"), ("kv_tokens", None)),
        ),
        # Ulysses: tokens split over `seq` outside attention; inside it all tokens and a slice of
        # the heads (XLA inserts the all-to-alls at the resharding points).
        Strategy(
            name="ulysses",
            params=(("embed", "fsdp"),),
            activations=(
                _BATCH,
                ("tokens", "seq"),
                ("attn_tokens", None),
                ("kv_tokens", None),
                ("attn_heads", ("seq", "tensor")),
            ),
        ),
        # Megatron tensor parallelism over heads/mlp plus sequence parallelism.
        Strategy(
            name="tp_sp",
            params=(("heads", "tensor"), ("mlp", "tensor"), ("embed", "fsdp")),
            activations=(
                _BATCH,
                ("tokens", "seq"),
                ("attn_tokens", "seq"),
                ("kv_tokens", None),
                ("attn_heads", "tensor"),
                ("mlp", "tensor"),
            ),
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class _Context:
    mesh: Mesh
    strategy: Strategy


_CONTEXT: contextvars.ContextVar[_Context | None] = contextvars.ContextVar(
    "vidax_sharding", default=None
)


def get_strategy(strategy: str | Strategy) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    try:
        return STRATEGIES[strategy]
    except KeyError:
        raise ValueError(
            f"unknown sharding strategy {strategy!r}; choose from {sorted(STRATEGIES)}"
        ) from None


@contextlib.contextmanager
def use_mesh(mesh: Mesh, strategy: str | Strategy = "fsdp_sp") -> Iterator[Mesh]:
    """Activates `strategy` on `mesh` for `shard` and `param_shardings`."""
    mesh = auto_mesh(mesh)
    token = _CONTEXT.set(_Context(mesh, get_strategy(strategy)))
    try:
        yield mesh
    finally:
        _CONTEXT.reset(token)


def auto_mesh(mesh: Mesh) -> Mesh:
    """`mesh` with vidax axis names checked and every axis in Auto mode.

    vidax shards through GSPMD annotations (`with_sharding_constraint`), which need Auto axes;
    `jax.make_mesh` now defaults to Explicit ones.
    """
    unknown = set(mesh.axis_names) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh axes {sorted(unknown)} are not vidax mesh axes {MESH_AXES}")
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def make_mesh(shape: Sequence[int], axis_names: Sequence[str], devices=None) -> Mesh:
    """A vidax mesh (Auto axes) over `devices` (default: all) in the given order."""
    import numpy as np

    devices = jax.devices() if devices is None else list(devices)
    n = int(np.prod(shape))
    if len(devices) < n:
        raise ValueError(f"mesh {tuple(shape)} needs {n} devices, {len(devices)} available")
    return auto_mesh(Mesh(np.asarray(devices[:n]).reshape(shape), tuple(axis_names)))


def current() -> tuple[Mesh, Strategy] | None:
    """The active (mesh, strategy), or None outside `use_mesh`."""
    ctx = _CONTEXT.get()
    return None if ctx is None else (ctx.mesh, ctx.strategy)


def logical_to_spec(
    axes: Sequence[str | None],
    rules: Rules,
    mesh: Mesh,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec under `rules`.

    Mesh axes absent from `mesh` (or of size 1) are dropped, each mesh axis is used at most
    once, and when `shape` is given a dimension is only sharded over the mesh axes whose product
    divides it (otherwise it stays replicated rather than silently padded).
    """
    table = dict(rules)
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for i, name in enumerate(axes):
        mesh_axes = [
            a
            for a in _as_tuple(table.get(name) if name is not None else None)
            if a in mesh.shape and mesh.shape[a] > 1 and a not in used
        ]
        if shape is not None:
            while mesh_axes and shape[i] % _prod(mesh.shape[a] for a in mesh_axes):
                mesh_axes.pop()
        used.update(mesh_axes)
        spec.append(
            None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else tuple(mesh_axes)
        )
    return PartitionSpec(*spec)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def shard(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Constrains activation `x` to the sharding its logical `axes` get under the active rules."""
    ctx = _CONTEXT.get()
    if ctx is None:
        return x
    if len(axes) != x.ndim:
        raise ValueError(f"shard: {len(axes)} logical axes {tuple(axes)} for a rank-{x.ndim} array")
    spec = logical_to_spec(axes, ctx.strategy.activations, ctx.mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(ctx.mesh, spec))


def param_shardings(state: nnx.State, mesh: Mesh | None = None, strategy=None) -> nnx.State:
    """NamedSharding for every parameter in `state` from its `sharding` annotation.

    Uses the active `use_mesh` context unless `mesh`/`strategy` are given. Works on abstract
    states (from `nnx.eval_shape`) as well as concrete ones.
    """
    if mesh is None or strategy is None:
        ctx = _CONTEXT.get()
        if ctx is None:
            raise ValueError("param_shardings needs a mesh: pass one or call inside use_mesh")
        mesh = mesh or ctx.mesh
        strategy = strategy or ctx.strategy
    mesh = auto_mesh(mesh)
    rules = get_strategy(strategy).params

    def one(variable):
        axes = variable.get_metadata().get("out_sharding")
        value = variable.get_value()
        if axes is None:
            axes = (None,) * value.ndim
        if len(axes) != value.ndim:
            raise ValueError(
                f"parameter of shape {value.shape} has {len(axes)} logical axes {axes}; "
                "stacked layers need nnx.vmap(transform_metadata={nnx.PARTITION_NAME: 'layers'})"
            )
        return NamedSharding(mesh, logical_to_spec(axes, rules, mesh, value.shape))

    return jax.tree.map(one, state, is_leaf=lambda v: isinstance(v, nnx.Variable))
