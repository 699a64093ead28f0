"""Stage 1 of the search: price every logical candidate from its traced program, no compiling.

For each candidate the Wan step is traced under its mesh and strategy (about a second for Wan
14B, against 20-90 s to compile it for a TPU topology). From its jaxpr:

- **memory per device**: the parameter shards exactly (the traced arguments' shardings), plus
  an activation estimate from the per-device sizes the program's sharding constraints give
  (residual stream, FFN hidden, the attention layout: gathered keys/values, Ulysses' full-length
  head slices, ring buffers) and, with sharded weights, one gathered layer double-buffered;
- **FLOPs per device**: every `dot_general` in the jaxpr (scan bodies times their length), the
  global ones divided by the devices that split the work and padded sequence lengths counted;
  per-device ones inside `shard_map` as they are; Pallas attention kernels at 4*l*s*k per row;
- **collective bytes per device**: explicit collectives inside `shard_map` (ring attention's
  permutes) from the jaxpr; the ones GSPMD will insert from the strategy in closed form per layer
  (all-gather of keys/values, Ulysses' all-to-alls, tensor-parallel all-reduces, weight
  all-gathers), sized from the same shapes.

Time bounds use contention-free unit-hop bidirectional rings: `upper = compute + communication`
(nothing overlapped), `lower = max(compute, communication)` (everything overlapped); these are
bounds of this model, not of the hardware (a 2D torus can beat a ring for all-to-all). A candidate
is dominated when its lower bound exceeds another candidate's upper bound; it does not fit when
its memory exceeds HBM less a margin. The `keep` cheapest survivors by upper bound go on to
stage 2 (compile), which measures what this stage estimates.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from vidax.models import get
from vidax.models.experts import TwoExperts
from vidax.planner.candidates import ShardingCandidate, Workload
from vidax.planner.hardware import Chip, GiB
from vidax.sharding.rules import auto_mesh, param_shardings, use_mesh

MEMORY_MARGIN = 0.1  # stage 1 is an estimate: keep 10% of HBM spare
# When nothing fits with the margin, candidates estimated up to this factor over HBM still go to
# stage 2, whose compiled memory analysis decides: the activation estimate runs high (Wan 14B
# 720p on v5e:2x4, Ulysses+fsdp: 8.53 GiB estimated, 6.44 GiB compiled).
TIGHT_FACTOR = 1.25
_ATTENTION_KERNELS = ("splash", "flash")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Stage-1 cost of one candidate (all per device, per denoising step).

    Attributes:
        candidate: the logical plan.
        flops: FLOPs.
        hbm_bytes: HBM traffic estimate (weights read once, activations per layer).
        param_bytes: resident parameter shards.
        activation_bytes: activation peak estimate (incl. gathered weights).
        collective_bytes: result bytes per collective kind.
        compute_time / comm_time: roofline and contention-free communication seconds.
        padding: fraction of padded (wasted) tokens.
    """

    candidate: ShardingCandidate
    flops: float
    hbm_bytes: float
    param_bytes: float
    activation_bytes: float
    collective_bytes: dict[str, float]
    compute_time: float
    comm_time: float
    padding: float

    @property
    def memory(self) -> float:
        return self.param_bytes + self.activation_bytes

    @property
    def upper(self) -> float:
        return self.compute_time + self.comm_time

    @property
    def lower(self) -> float:
        return max(self.compute_time, self.comm_time)


@dataclasses.dataclass(frozen=True)
class Pruned:
    """Stage-1 outcome: what survives and why the rest was dropped."""

    estimates: tuple[Estimate, ...]  # every candidate, cheapest upper bound first
    fits: tuple[Estimate, ...]
    undominated: tuple[Estimate, ...]
    survivors: tuple[Estimate, ...]  # the ones to compile
    tight: bool = False  # nothing fit with the margin: survivors are the least memory first

    def summary(self) -> str:
        fit = (
            f"none fit HBM with a {MEMORY_MARGIN:.0%} margin, {len(self.fits)} within "
            f"{TIGHT_FACTOR:.2f}x of it"
            if self.tight
            else f"{len(self.fits)} fit HBM"
        )
        return (
            f"stage 1: {len(self.estimates)} candidates, {fit}, "
            f"{len(self.undominated)} not dominated, {len(self.survivors)} kept for compiling"
        )


# ---- the traced step -------------------------------------------------------------------------
@functools.cache
def _abstract_model(model: str):
    """(graphdef, abstract state) of a preset, built once per process. A two-expert preset
    (Wan 2.2 A14B) holds both experts' weights; each step runs one (`TwoExperts`)."""
    spec = get(model)
    ratio = spec.boundary_ratio
    if ratio is None:
        return nnx.split(nnx.eval_shape(lambda: spec.build()))
    return nnx.split(
        nnx.eval_shape(lambda: TwoExperts(spec.build(seed=0), spec.build(seed=1), ratio))
    )


def abstract_step(workload: Workload, mesh, strategy):
    """The jitted Wan step and its abstract, sharded arguments on `mesh`. Image-to-video
    presets also take their condition channels and (Wan 2.1 I2V) image-encoder tokens.

    Call (and trace or lower) inside `vidax.sharding.use_mesh(mesh, strategy)`.

    Returns:
        (jitted step, (state, x, timestep, context, image inputs) ShapeDtypeStructs).
    """
    graphdef, state = _abstract_model(workload.model)
    shardings = param_shardings(state, mesh, strategy)
    state = jax.tree.map(
        lambda v, s: v.replace(jax.ShapeDtypeStruct(v.get_value().shape, v.dtype, sharding=s)),
        state,
        shardings,
        is_leaf=lambda v: isinstance(v, nnx.Variable),
    )
    config = workload.spec.config
    batch_axes = tuple(a for a in ("data", "fsdp") if mesh.shape.get(a, 1) > 1)
    batched = NamedSharding(mesh, P(batch_axes or None))
    b = workload.batch
    x = jax.ShapeDtypeStruct((b, *workload.latent_shape), jnp.float32, sharding=batched)
    t = jax.ShapeDtypeStruct((b,), jnp.float32, sharding=batched)
    ctx = jax.ShapeDtypeStruct((b, config.text_len, config.text_dim), jnp.float32, sharding=batched)
    image: dict = {}
    if workload.spec.task != "t2v":
        image["condition"] = jax.ShapeDtypeStruct(
            (b, *workload.latent_shape[:3], config.image_channels), jnp.float32, sharding=batched
        )
    encoder = workload.spec.image_encoder_spec
    if config.image_dim is not None and encoder is not None:
        tokens = encoder.config.num_tokens
        image["image"] = jax.ShapeDtypeStruct(
            (b, tokens, config.image_dim), jnp.float32, sharding=batched
        )

    @jax.jit
    def step(state, x, t, ctx, image):
        return nnx.merge(graphdef, state)(x, t, ctx, **image)

    return step, (state, x, t, ctx, image)


def candidate_mesh(candidate: ShardingCandidate, devices: Sequence):
    """The candidate's mesh over `devices` in the given order (Auto axes)."""
    grid = np.asarray(list(devices), dtype=object).reshape(candidate.mesh_shape)
    return auto_mesh(Mesh(grid, candidate.axis_names))


# ---- jaxpr walk ------------------------------------------------------------------------------
@dataclasses.dataclass
class _Walk:
    global_flops: float = 0.0  # outside shard_map: whole-program FLOPs
    local_flops: float = 0.0  # inside shard_map: per-device FLOPs
    local_collectives: dict = dataclasses.field(default_factory=dict)
    constraint_bytes: list = dataclasses.field(default_factory=list)  # per-device, in layers


def _padded_shard_shape(sharding, shape) -> tuple[int, ...]:
    """Per-device shape under a NamedSharding, uneven dimensions rounded up (GSPMD pads)."""
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    out = []
    for size, axes in zip(shape, spec, strict=True):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        out.append(-(-size // math.prod(sharding.mesh.shape[a] for a in axes)))
    return tuple(out)


def _sub_jaxprs(params):
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(v, "eqns"):
                yield v
            elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
                yield v.jaxpr


def _walk(jaxpr, out: _Walk, mult: float, local: bool, in_scan: bool) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            flops = 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)
            if local:
                out.local_flops += mult * flops
            else:
                out.global_flops += mult * flops
            continue
        if name == "pallas_call":
            kernel = str(eqn.params.get("name", "")) + str(eqn.params.get("name_and_src_info", ""))
            if any(k in kernel for k in _ATTENTION_KERNELS):
                arrays = [
                    v.aval.shape
                    for v in eqn.invars
                    if len(v.aval.shape) >= 3 and jnp.issubdtype(v.aval.dtype, jnp.floating)
                ]
                if len(arrays) >= 2:
                    q, k = arrays[0], arrays[1]
                    flops = 4.0 * math.prod(q[:-1]) * k[-2] * q[-1]
                    if local:
                        out.local_flops += mult * flops
                    else:
                        out.global_flops += mult * flops
            continue  # the kernel body is per tile, not per call
        if name in ("ppermute", "all_to_all", "all_gather", "psum", "reduce_scatter") and local:
            nbytes = sum(v.aval.size * v.aval.dtype.itemsize for v in eqn.outvars)
            kind = {
                "ppermute": "collective-permute",
                "all_to_all": "all-to-all",
                "all_gather": "all-gather",
                "psum": "all-reduce",
                "reduce_scatter": "reduce-scatter",
            }[name]
            out.local_collectives[kind] = out.local_collectives.get(kind, 0.0) + mult * nbytes
            continue
        if name == "sharding_constraint" and in_scan:
            aval = eqn.outvars[0].aval
            shard = _padded_shard_shape(eqn.params["sharding"], aval.shape)
            out.constraint_bytes.append(math.prod(shard) * aval.dtype.itemsize)
        if name == "cond":  # one branch runs (e.g. one of two experts): price the costliest
            walks = []
            for branch in eqn.params["branches"]:
                w = _Walk()
                _walk(branch.jaxpr, w, mult, local, in_scan)
                walks.append(w)
            worst = max(walks, key=lambda w: w.global_flops + w.local_flops)
            out.global_flops += worst.global_flops
            out.local_flops += worst.local_flops
            for kind, nbytes in worst.local_collectives.items():
                out.local_collectives[kind] = out.local_collectives.get(kind, 0.0) + nbytes
            out.constraint_bytes.extend(worst.constraint_bytes)
            continue
        sub_mult = mult * eqn.params["length"] if name == "scan" else mult
        for sub in _sub_jaxprs(eqn.params):
            _walk(sub, out, sub_mult, local or name == "shard_map", in_scan or name == "scan")


# ---- closed forms ----------------------------------------------------------------------------
def _ring_time(chip: Chip, n: int, result_bytes: float, *, all_reduce: bool = False) -> float:
    """All-gather (reduce-scatter) time on an ideal bidirectional unit-hop ring of n chips."""
    if n <= 1:
        return 0.0
    t = chip.alpha_op + (n - 1) * (chip.alpha_hop + result_bytes / n / (2 * chip.link_bandwidth))
    return 2 * t if all_reduce else t


def _all_to_all_time(chip: Chip, n: int, buffer_bytes: float) -> float:
    """All-to-all on an ideal bidirectional ring: shortest-path link load per direction."""
    if n <= 1:
        return 0.0
    hops = sum(min(j, n - j) for j in range(1, n))
    load = buffer_bytes / n * hops / 2  # each chip's chunks spread over its two directions
    return chip.alpha_op + (n - 1) * chip.alpha_hop + load / chip.link_bandwidth


@functools.lru_cache(maxsize=256)
def _traced(workload: Workload, b: int, s: int, t: int, sequence: str, devices: tuple) -> _Walk:
    """The jaxpr statistics of one logical layout (shared by both weight modes)."""
    candidate = ShardingCandidate(batch=b, seq=s, tensor=t, sequence=sequence, weights="replicated")
    mesh = candidate_mesh(candidate, devices)
    with use_mesh(mesh, candidate.strategy) as mesh:
        step, args = abstract_step(workload, mesh, candidate.strategy)
        traced = step.trace(*args)
    walk = _Walk()
    _walk(traced.jaxpr.jaxpr, walk, 1.0, False, False)
    return walk


def estimate_candidate(
    workload: Workload, candidate: ShardingCandidate, devices, chip: Chip
) -> Estimate:
    """Traces the step for `candidate` on `devices` and prices it (no lowering, no compile).

    Raises:
        Whatever tracing raises for an invalid candidate.
    """
    config = workload.spec.config
    walk = _traced(
        workload,
        candidate.batch,
        candidate.seq,
        candidate.tensor,
        candidate.sequence,
        tuple(devices),
    )
    # Weights are the only thing the weight mode changes: their shards come straight from the
    # abstract state, without tracing again.
    mesh = candidate_mesh(candidate, devices)
    _, state = _abstract_model(workload.model)
    shardings = param_shardings(state, mesh, candidate.strategy)
    leaves = jax.tree.leaves(
        jax.tree.map(
            lambda v, sh: jax.ShapeDtypeStruct(v.get_value().shape, v.dtype, sharding=sh),
            state,
            shardings,
            is_leaf=lambda v: isinstance(v, nnx.Variable),
        )
    )
    param_bytes = float(
        sum(math.prod(v.sharding.shard_shape(v.shape)) * v.dtype.itemsize for v in leaves)
    )
    global_param_bytes = float(sum(v.size * v.dtype.itemsize for v in leaves))

    b, s, t = candidate.mesh_shape
    tokens = workload.tokens
    padded = candidate.padded_tokens(tokens)
    pad_factor = padded / tokens
    e = config.compute_dtype.itemsize
    bl = workload.batch // b
    local_tokens = padded // s
    d, f, layers = config.dim, config.ffn_dim, config.num_layers
    dt = d // t
    flops = walk.global_flops * pad_factor / candidate.num_devices + walk.local_flops

    # Per-layer GSPMD collectives (per device), from the strategy.
    per_layer: list[tuple[str, int, float]] = []  # (kind, group size, bytes)
    residual = bl * local_tokens * d * e
    if t > 1:  # Megatron: attention out, cross-attention out, FFN out
        per_layer += [("all-reduce", t, residual)] * 3
    if s > 1 and candidate.sequence == "gather":
        per_layer += [("all-gather", s, bl * padded * dt * e)] * 2  # k, v
    if s > 1 and candidate.sequence == "ulysses":
        per_layer += [("all-to-all", s, bl * local_tokens * dt * e)] * 6  # q k v o, cross q o
    # Two experts (Wan 2.2 A14B) both stay resident, but a step runs (gathers, reads) one.
    experts = 1 if workload.spec.boundary_ratio is None else 2
    layer_params = global_param_bytes / experts / layers
    if candidate.weights == "fsdp" and b * s > 1:
        per_layer.append(("all-gather", b * s, layer_params / t))

    collective_bytes: dict[str, float] = {}
    comm = 0.0
    for kind, n, nbytes in per_layer:
        collective_bytes[kind] = collective_bytes.get(kind, 0.0) + layers * nbytes
        if kind == "all-to-all":
            comm += layers * _all_to_all_time(chip, n, nbytes)
        else:
            comm += layers * _ring_time(chip, n, nbytes, all_reduce=kind == "all-reduce")
    for kind, nbytes in walk.local_collectives.items():
        collective_bytes[kind] = collective_bytes.get(kind, 0.0) + nbytes
        if kind == "collective-permute":  # one unit hop per ring step
            steps = layers * 2 * (s - 1)  # k and v each step
            comm += steps * (chip.alpha_op + chip.alpha_hop) + nbytes / chip.link_bandwidth

    # Memory: parameters exactly; activations from the layer's largest constrained tensors.
    biggest = sorted(walk.constraint_bytes, reverse=True)[:4]
    activations = 8 * residual + 2 * bl * local_tokens * (f // t) * e + sum(biggest)
    if candidate.sequence == "gather" and s > 1:
        activations += 2 * bl * padded * dt * e
    elif candidate.sequence == "ulysses" and s > 1:
        activations += 4 * bl * padded * d // (s * t) * e
    elif candidate.sequence == "ring" and s > 1:
        activations += 4 * bl * local_tokens * dt * e
    if candidate.weights == "fsdp" and b * s > 1:
        activations += 2 * layer_params / t
    io = 3 * bl * math.prod(workload.latent_shape) * 4 // s  # latent in, flow out (f32)
    activations += io

    weights_read = (
        layers * layer_params / t if candidate.weights == "fsdp" else param_bytes / experts
    )
    hbm_bytes = weights_read + layers * 24 * residual
    compute = max(flops / chip.peak_flops, hbm_bytes / chip.hbm_bandwidth)
    return Estimate(
        candidate=candidate,
        flops=flops,
        hbm_bytes=hbm_bytes,
        param_bytes=param_bytes,
        activation_bytes=float(activations),
        collective_bytes=collective_bytes,
        compute_time=compute,
        comm_time=comm,
        padding=1 - tokens / padded,
    )


def prune(
    estimates: Sequence[Estimate], chip: Chip, *, keep: int, margin: float = MEMORY_MARGIN
) -> Pruned:
    """Drops candidates that do not fit or are dominated; keeps the `keep` cheapest.

    When no estimate fits HBM less the margin, the memory estimate is too coarse to decide:
    candidates whose weights fit and whose estimate is within `TIGHT_FACTOR` of HBM go on to
    compiling, least memory first (the compiled program's memory analysis decides).

    Raises:
        ValueError: if no candidate can fit in HBM, with the smallest memory need and its split.
    """
    ranked = sorted(estimates, key=lambda e: (e.upper, e.memory))
    budget = chip.hbm_bytes * (1 - margin)
    fits = [e for e in ranked if e.memory <= budget]
    tight = not fits
    if tight:
        fits = sorted(
            (
                e
                for e in ranked
                if e.param_bytes <= chip.hbm_bytes and e.memory <= TIGHT_FACTOR * chip.hbm_bytes
            ),
            key=lambda e: (e.memory, e.upper),
        )
    if not fits:
        best = min(ranked, key=lambda e: e.memory)
        raise ValueError(
            f"no candidate fits in {chip.name} HBM ({chip.hbm_bytes / GiB:.2f} GiB per chip, "
            f"{budget / GiB:.2f} GiB after a {margin:.0%} margin): the least memory, "
            f"{best.candidate.name}, needs about {best.memory / GiB:.2f} GiB per chip "
            f"({best.param_bytes / GiB:.2f} GiB of weights + {best.activation_bytes / GiB:.2f} "
            f"GiB of activations); use a larger slice or a smaller video"
        )
    if tight:
        undominated = fits  # fitting comes first: no cost-based dominance
    else:
        best_upper = min(e.upper for e in fits)
        undominated = [e for e in fits if e.lower <= best_upper]
    return Pruned(
        estimates=tuple(ranked),
        fits=tuple(fits),
        undominated=tuple(undominated),
        survivors=tuple(undominated[: max(1, keep)]),
        tight=tight,
    )
