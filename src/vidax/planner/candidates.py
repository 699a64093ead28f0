"""Model-independent pieces of the candidate search: mesh factorisations, padding, HBM checks.

The model integration (strategies over `data, fsdp, seq, tensor`) builds on these:

    shapes = mesh_shapes(16, ("data", "seq", "tensor"), allowed={"tensor": lambda t: 40 % t == 0})
    compiled = compile_checked(jax.jit(step).lower(*args), chip)   # clear error if OOM
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from vidax.planner.hardware import Chip, GiB


def mesh_shapes(
    num_devices: int,
    axes: Sequence[str],
    *,
    allowed: Mapping[str, Callable[[int], bool]] | None = None,
) -> list[dict[str, int]]:
    """Every ordered factorisation of `num_devices` over `axes` that `allowed` accepts.

    Args:
        num_devices: chips in the slice.
        axes: mesh axis names, outermost first.
        allowed: per-axis predicates on the axis size (e.g. heads divisible by it); axes
            without one accept any size.

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
    if not out:
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
        m = _OOM.search(text)
        detail = f"needs {m.group(1)} of temporaries, {m.group(2)} available" if m else text[:300]
        raise ValueError(
            f"does not fit in {chip.name} HBM ({chip.hbm_bytes / GiB:.2f} GiB usable per chip): "
            f"{detail}; shard weights/activations more or use more chips"
        ) from e
