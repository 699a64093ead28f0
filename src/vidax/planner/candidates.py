"""Model-independent pieces of the candidate search: mesh factorisations, padding, HBM checks.

The model integration (strategies over `data, fsdp, seq, tensor`) builds on these:

    shapes = mesh_shapes(16, ("data", "seq", "tensor"), allowed={"tensor": lambda t: 40 % t == 0})
    compiled = compile_checked(jax.jit(step).lower(*args), chip)   # clear error if OOM
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

from vidax.planner.hardware import Chip, GiB


def mesh_shapes(
    num_devices: int,
    axes: Sequence[str],
    *,
    allowed: Mapping[str, Callable[[int], bool]] | None = None,
    empty_ok: bool = False,
) -> list[dict[str, int]]:
    """Every ordered factorisation of `num_devices` over `axes` that `allowed` accepts.

    Args:
        num_devices: chips in the slice.
        axes: mesh axis names, outermost first.
        allowed: per-axis predicates on the axis size (e.g. heads divisible by it); axes
            without one accept any size.
        empty_ok: return an empty list instead of raising when nothing passes.

    Returns:
        `{axis: size}` dicts (sizes multiply to `num_devices`), in lexicographic order.

    Raises:
        ValueError: if no factorisation passes, naming the constraint sets that were tried.
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    allowed = dict(allowed or {})
    unknown = set(allowed) - set(axes)
    if unknown:
        raise ValueError(f"constraints for unknown axes {sorted(unknown)}; axes are {list(axes)}")
    out: list[dict[str, int]] = []

    def rec(i: int, left: int, acc: list[int]):
        if i == len(axes) - 1:
            sizes = [*acc, left]
            if all(allowed.get(a, lambda _: True)(s) for a, s in zip(axes, sizes, strict=True)):
                out.append(dict(zip(axes, sizes, strict=True)))
            return
        for d in range(1, left + 1):
            if left % d == 0:
                rec(i + 1, left // d, [*acc, d])

    if not axes:
        raise ValueError("mesh_shapes needs at least one axis")
    rec(0, num_devices, [])
    if not out and not empty_ok:
        raise ValueError(
            f"no mesh of {num_devices} chips over axes {list(axes)} satisfies the size "
            f"constraints on {sorted(allowed)}"
        )
    return out


def padded_length(length: int, multiple: int) -> tuple[int, float]:
    """`length` rounded up to a multiple, and the wasted fraction of the padded length.

    Sequence parallelism over `multiple` shards pads tokens that do not divide; the waste is
    the share of compute and traffic spent on padding.
    """
    if length < 1 or multiple < 1:
        raise ValueError(f"length and multiple must be positive, got {length}, {multiple}")
    padded = -(-length // multiple) * multiple
    return padded, (padded - length) / padded


def device_memory(compiled) -> int:
    """Peak bytes one device needs for a compiled program (arguments, outputs, temporaries)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise ValueError("the compiled program reports no memory analysis")
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.generated_code_size_in_bytes
    )


def check_fits(compiled, chip: Chip, *, margin: float = 0.0) -> int:
    """Raises a ValueError with the numbers if `compiled` needs more than `chip`'s usable HBM.

    Args:
        compiled: a `jax.stages.Compiled`.
        chip: the target generation.
        margin: fraction of HBM kept free (e.g. 0.05 for fragmentation).

    Returns:
        The bytes needed per device.
    """
    need = device_memory(compiled)
    budget = chip.hbm_bytes * (1.0 - margin)
    if need > budget:
        raise ValueError(
            f"program needs {need / GiB:.2f} GiB per device but {chip.name} has "
            f"{chip.hbm_bytes / GiB:.2f} GiB usable ({budget / GiB:.2f} GiB after a "
            f"{margin:.0%} margin): shard more (fsdp/tensor) or use more chips"
        )
    return need


_OOM = re.compile(
    r"required for HLO temporaries \(([\d.]+\w?)\) exceeds available HBM \(([\d.]+\w?)\)"
)


def compile_checked(lowered, chip: Chip):
    """`lowered.compile()`, turning XLA's compile-time HBM OOM into a ValueError with numbers."""
    try:
        return lowered.compile()
    except Exception as e:
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text and "HbmOom" not in text:
            raise
        if "HBM" not in text and "HbmOom" not in text:  # e.g. a kernel's SMEM or VMEM
            detail = next((line for line in text.splitlines() if "Ran out" in line), text[:200])
            raise ValueError(f"does not compile for {chip.name}: {detail.strip()}") from e
        m = _OOM.search(text)
        detail = f"needs {m.group(1)} of temporaries, {m.group(2)} available" if m else text[:300]
        raise ValueError(
            f"does not fit in {chip.name} HBM ({chip.hbm_bytes / GiB:.2f} GiB usable per chip): "
            f"{detail}; shard weights/activations more or use more chips"
        ) from e


# ---- the model's candidate space -------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """One denoising step to plan for: a model preset and the video it generates.

    Attributes:
        model: preset name in `vidax.models` (a Wan DiT).
        frames, height, width: pixel video size (e.g. 81 frames at 480x832).
        cfg: classifier-free guidance: the conditional and unconditional passes run as one
            batch of 2 per video.
        videos: videos generated at once.
    """

    model: str
    frames: int
    height: int
    width: int
    cfg: bool = True
    videos: int = 1

    def __post_init__(self):
        if self.videos < 1:
            raise ValueError(f"videos must be >= 1, got {self.videos}")
        self.latent_shape  # noqa: B018 - validates the sizes against the model's VAE/patch

    @property
    def spec(self):
        # Imported here: this module is plain data (no jax, flax or model code at import).
        from vidax.models import get

        spec = get(self.model)
        if spec.family != "wan":
            raise ValueError(f"the planner supports Wan presets; {self.model!r} is {spec.family}")
        return spec

    @property
    def batch(self) -> int:
        """Transformer batch: videos, doubled by CFG."""
        return self.videos * (2 if self.cfg else 1)

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """(t, h, w, c) latent of one video."""
        return self.spec.geometry().latent_shape(self.frames, self.height, self.width)

    @property
    def tokens(self) -> int:
        t, h, w, _ = self.latent_shape
        return self.spec.config.num_tokens(t, h, w)

    def describe(self) -> str:
        return (
            f"{self.model} {self.frames}x{self.height}x{self.width}"
            f"{' cfg' if self.cfg else ''} ({self.batch}x{self.tokens} tokens)"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingCandidate:
    """A logical plan: mesh sizes and a composed strategy (`vidax.sharding.compose_strategy`).

    The mesh always has three axes, `(batch axis, "seq", "tensor")`; the batch axis is called
    `fsdp` when weights are sharded (ZeRO-3 over `fsdp` and `seq`) and `data` otherwise.

    Attributes:
        batch: devices splitting the batch (CFG pair x videos).
        seq: devices splitting the video tokens (`sequence` says how attention copes).
        tensor: devices splitting heads and the FFN hidden (Megatron).
        sequence: "none", "gather", "ulysses" or "ring".
        weights: "replicated" or "fsdp".
    """

    batch: int
    seq: int
    tensor: int
    sequence: str
    weights: str

    @property
    def axis_names(self) -> tuple[str, str, str]:
        return ("fsdp" if self.weights == "fsdp" else "data", "seq", "tensor")

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.batch, self.seq, self.tensor)

    @property
    def num_devices(self) -> int:
        return self.batch * self.seq * self.tensor

    @property
    def strategy(self):
        from vidax.sharding.rules import compose_strategy  # plain-data module: see `spec`

        return compose_strategy(self.sequence, tensor=self.tensor > 1, weights=self.weights)

    @property
    def name(self) -> str:
        sizes = "x".join(
            f"{a[0] if a != 'fsdp' else 'f'}{s}"
            for a, s in zip(self.axis_names, self.mesh_shape, strict=True)
        )
        return f"{self.strategy.name} [{sizes}]"

    def padded_tokens(self, tokens: int) -> int:
        return padded_length(tokens, self.seq)[0]


def enumerate_candidates(
    workload: Workload,
    num_devices: int,
    *,
    sequence_modes: Sequence[str] = ("gather", "ulysses", "ring"),
    weight_modes: Sequence[str] = ("replicated", "fsdp"),
) -> list[ShardingCandidate]:
    """Every logical plan of `workload` on `num_devices` chips (before any cost model).

    Rules: batch devices divide the batch (no redundant copies of a video), tensor devices
    divide the heads and the FFN width, Ulysses needs heads divisible by seq x tensor, each
    sequence shard holds at least one token (non-dividing token counts are padded), and
    sequence parallelism is used only when the other axes cannot absorb the chips.

    Raises:
        ValueError: when no candidate uses exactly `num_devices` chips, with the sizes that
            constrain it.
    """
    config = workload.spec.config
    tokens = workload.tokens
    out: list[ShardingCandidate] = []
    for sizes in mesh_shapes(
        num_devices,
        ("batch", "seq", "tensor"),
        allowed={
            "batch": lambda b: workload.batch % b == 0,
            "tensor": lambda t: config.num_heads % t == 0 and config.ffn_dim % t == 0,
            "seq": lambda s: s <= tokens,
        },
        empty_ok=True,
    ):
        b, s, t = sizes["batch"], sizes["seq"], sizes["tensor"]
        modes = ["none"] if s == 1 else list(sequence_modes)
        for mode in modes:
            if mode == "ulysses" and config.num_heads % (s * t):
                continue
            for weights in weight_modes:
                if weights == "fsdp" and b * s == 1:
                    continue  # nothing to shard the weights over: same as replicated
                out.append(
                    ShardingCandidate(batch=b, seq=s, tensor=t, sequence=mode, weights=weights)
                )
    if not out:
        raise ValueError(
            f"no sharding of {workload.describe()} uses exactly {num_devices} chips: the batch "
            f"({workload.batch}) x tensor (divisors of {config.num_heads} heads and "
            f"{config.ffn_dim} FFN) x sequence (<= {tokens} tokens; modes "
            f"{list(sequence_modes)}) factors must multiply to {num_devices}"
        )
    return out
