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
    """A named pair of logical->mesh rule tables (parameters, activations).

    Attributes:
        name: how plans and the CLI refer to it.
        params / activations: `(logical axis, mesh axes)` rules.
        pad: activation axes that may be sharded unevenly: GSPMD pads the last shard (e.g.
            32,760 tokens over 16 devices), instead of the axis staying replicated.
        ring: self-attention runs as ring attention over the `seq` axis (keys/values are
            passed round the ring with collective-permutes, `vidax.nn.ring_attention`) instead
            of being gathered.
    """

    name: str
    params: Rules = ()
    activations: Rules = ()
    pad: tuple[str, ...] = ()
    ring: bool = False

    def __post_init__(self):
        for table, vocab in ((self.params, PARAM_AXES), (self.activations, ACTIVATION_AXES)):
            for logical, mesh_axes in table:
                if logical not in vocab:
                    raise ValueError(f"strategy {self.name!r}: unknown logical axis {logical!r}")
                for axis in _as_tuple(mesh_axes):
                    if axis not in MESH_AXES:
                        raise ValueError(f"strategy {self.name!r}: unknown mesh axis {axis!r}")
        for logical in self.pad:
            if logical not in ACTIVATION_AXES:
                raise ValueError(f"strategy {self.name!r}: unknown pad axis {logical!r}")


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


# -- composed strategies (the planner's candidate space) ------------------------------------------
SEQUENCE_MODES = ("none", "gather", "ulysses", "ring")
_SEQUENCE_NAMES = {
    "none": "batch",
    "gather": "sp-gather",
    "ulysses": "sp-ulysses",
    "ring": "sp-ring",
}
WEIGHT_MODES = ("replicated", "fsdp")


def compose_strategy(
    sequence: str = "none", *, tensor: bool = False, weights: str = "replicated"
) -> Strategy:
    """A strategy from independent choices; its name round-trips through `get_strategy`.

    Activations are always split by batch over `data` and `fsdp` (the CFG pair and videos).

    Args:
        sequence: how the `seq` axis splits the video tokens:
            "none" (no sequence parallelism),
            "gather" (queries stay split; keys/values are all-gathered for attention),
            "ulysses" (all-to-all from tokens to heads around attention; heads must divide by
            seq x tensor),
            "ring" (keys/values travel round the `seq` ring, `vidax.nn.ring_attention`).
            Tokens that do not divide are padded (`Strategy.pad`).
        tensor: Megatron tensor parallelism over the `tensor` axis (heads and FFN hidden).
        weights: "replicated", or "fsdp": the `embed` dimension of every weight is sharded over
            `fsdp` and `seq` and gathered per layer (ZeRO-3), for models larger than one chip.

    Returns:
        A `Strategy` named e.g. "sp-ulysses+tp+fsdp" or "batch".
    """
    if sequence not in SEQUENCE_MODES:
        raise ValueError(f"unknown sequence mode {sequence!r}; choose from {SEQUENCE_MODES}")
    if weights not in WEIGHT_MODES:
        raise ValueError(f"unknown weight mode {weights!r}; choose from {WEIGHT_MODES}")
    acts: list[tuple[str, MeshAxes]] = [_BATCH]
    params: list[tuple[str, MeshAxes]] = []
    heads: MeshAxes = "tensor" if tensor else None
    if sequence == "gather":
        acts += [("tokens", "seq"), ("attn_tokens", "seq"), ("kv_tokens", None)]
    elif sequence == "ulysses":
        acts += [("tokens", "seq"), ("attn_tokens", None), ("kv_tokens", None)]
        heads = ("seq", "tensor") if tensor else "seq"
    elif sequence == "ring":
        acts += [("tokens", "seq"), ("attn_tokens", "seq"), ("kv_tokens", "seq")]
    if heads is not None:
        acts.append(("attn_heads", heads))
    if tensor:
        acts.append(("mlp", "tensor"))
        params += [("heads", "tensor"), ("mlp", "tensor")]
    if weights == "fsdp":
        params.append(("embed", ("fsdp", "seq")))
    name = (
        _SEQUENCE_NAMES[sequence]
        + ("+tp" if tensor else "")
        + ("+fsdp" if weights == "fsdp" else "")
    )
    return Strategy(
        name=name,
        params=tuple(params),
        activations=tuple(acts),
        pad=("tokens", "attn_tokens", "kv_tokens") if sequence != "none" else (),
        ring=sequence == "ring",
    )


def _parse_composed(name: str) -> Strategy | None:
    base, *flags = name.split("+")
    modes = {v: k for k, v in _SEQUENCE_NAMES.items()}
    if base not in modes or len(set(flags)) != len(flags) or set(flags) - {"tp", "fsdp"}:
        return None
    strategy = compose_strategy(
        modes[base], tensor="tp" in flags, weights="fsdp" if "fsdp" in flags else "replicated"
    )
    return strategy if strategy.name == name else None  # flags in canonical order only


@dataclasses.dataclass(frozen=True)
class _Context:
    mesh: Mesh
    strategy: Strategy


_CONTEXT: contextvars.ContextVar[_Context | None] = contextvars.ContextVar(
    "vidax_sharding", default=None
)


def get_strategy(strategy: str | Strategy) -> Strategy:
    """A preset (`STRATEGIES`) or composed (`compose_strategy`) strategy by name."""
    if isinstance(strategy, Strategy):
        return strategy
    if strategy in STRATEGIES:
        return STRATEGIES[strategy]
    composed = _parse_composed(strategy) if isinstance(strategy, str) else None
    if composed is None:
        raise ValueError(
            f"unknown sharding strategy {strategy!r}; choose from {sorted(STRATEGIES)} or a "
            "composed name such as 'sp-ulysses+tp+fsdp' (see compose_strategy)"
        )
    return composed


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
    *,
    pad: Sequence[str] = (),
) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec under `rules`.

    Mesh axes absent from `mesh` (or of size 1) are dropped, each mesh axis is used at most
    once, and when `shape` is given a dimension is only sharded over the mesh axes whose product
    divides it (otherwise it stays replicated rather than silently padded), unless its logical
    name is in `pad`: then it is sharded unevenly and GSPMD pads the last shard (it still needs
    at least one element per shard).
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
            uneven_ok = name in pad
            while mesh_axes and (
                shape[i] < _prod(mesh.shape[a] for a in mesh_axes)
                if uneven_ok
                else shape[i] % _prod(mesh.shape[a] for a in mesh_axes)
            ):
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
    spec = logical_to_spec(axes, ctx.strategy.activations, ctx.mesh, x.shape, pad=ctx.strategy.pad)
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
