"""Per-generation TPU chip constants for the planner's cost model.

Every number carries its source. "Measured" numbers come from compile-only TPU devices on a
CPU host (jax 0.10.2, libtpu 0.0.52): compiling a program larger than HBM makes XLA report the
usable HBM in its `CompileTimeHbmOom` error, e.g. "exceeds available HBM (15.75G)".

Sources:
- [book] jax-ml/scaling-book `tpus.md` (chip table: HBM bandwidth, bf16 FLOP/s; ICI table:
  one-way bandwidth per link; "per-hop latency ... about 1us") and `sharding.md`.
- [docs] docs.cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e} (ports, peak FLOP/s, HBM size).
- [maxtext] AI-Hypercomputer/maxtext `MaxText/accelerator_to_spec_map.py` (slice shapes, wrap).
"""

from __future__ import annotations

import dataclasses

GiB = 1 << 30


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    """Constants of one TPU generation (one JAX device per chip, megacore on v4/v5p).

    Attributes:
        name: short generation name used in topology strings ("v5e").
        device_kind: `jax.Device.device_kind` of its compile-only devices.
        ici_ports: ICI links per chip (4 on the 2D-torus chips, 6 on the 3D ones).
        link_bandwidth: one-way bandwidth of one ICI link, bytes/s.
        hbm_bytes: HBM usable by XLA programs, bytes.
        hbm_bandwidth: HBM bandwidth, bytes/s.
        peak_flops: dense bf16 peak, FLOP/s.
        alpha_hop: latency added by each ICI hop, seconds.
        alpha_op: fixed launch/synchronisation cost of one collective, seconds. Not measured:
            a placeholder until hardware microbenchmarks fit it.
        ndim: number of torus dimensions (2 or 3).
        megacore: whether jax exposes both TensorCores of a chip as one device.
    """

    name: str
    device_kind: str
    ici_ports: int
    link_bandwidth: float
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    alpha_hop: float = 1e-6  # [book] tpus.md: "the per-hop latency for TPU v5e is 1us"
    alpha_op: float = 5e-6  # placeholder; the book measures ~8us for a 3-hop latency-bound AG
    ndim: int
    megacore: bool = False

    def __post_init__(self):
        for field in ("link_bandwidth", "hbm_bytes", "hbm_bandwidth", "peak_flops"):
            if getattr(self, field) <= 0:
                raise ValueError(f"chip {self.name}: {field} must be positive")
        if self.ndim not in (2, 3):
            raise ValueError(f"chip {self.name}: ndim must be 2 or 3, got {self.ndim}")

    @property
    def bidirectional_link_bandwidth(self) -> float:
        """Bytes/s over one link counting both directions (the book's W_ici on a ring)."""
        return 2 * self.link_bandwidth


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip(
            name="v5e",
            device_kind="TPU v5 lite",
            ici_ports=4,  # [docs] v5e: 2D torus, 4 ICI ports
            # [book] 4.5e10 one-way per link; [docs] "400 GB/s bidirectional per chip" would
            # give 50 GB/s (4 ports x 2 directions). We keep the book's more conservative value.
            link_bandwidth=4.5e10,
            hbm_bytes=int(15.75 * GiB),  # measured: 16 GiB physical, 15.75G usable
            hbm_bandwidth=8.1e11,  # [book] 8.1e11 ([docs] 819 GB/s)
            peak_flops=1.97e14,  # [book]/[docs] 197 TFLOP/s bf16
            ndim=2,
        ),
        Chip(
            name="v6e",
            device_kind="TPU v6 lite",
            ici_ports=4,  # [docs] v6e (Trillium): 2D torus, 4 ports
            link_bandwidth=9e10,  # [book] 9e10 one-way per link ([docs] 800 GB/s/chip bidi)
            hbm_bytes=int(31.24 * GiB),  # measured: 32 GiB physical, 31.24G usable
            hbm_bandwidth=1.6e12,  # [book] 1.6e12 ([docs] 1640 GB/s)
            peak_flops=9.18e14,  # [docs] 918 TFLOP/s bf16 ([book] 9.2e14)
            ndim=2,
        ),
        Chip(
            name="v5p",
            device_kind="TPU v5",
            ici_ports=6,  # [docs] v5p: 3D torus, 6 ports
            link_bandwidth=9e10,  # [book] 9e10 one-way per link ([docs] 1200 GB/s/chip bidi)
            hbm_bytes=int(95.73 * GiB),  # measured: 96 GiB physical, 95.73G usable
            hbm_bandwidth=2.765e12,  # [docs] 2765 GB/s ([book] 2.8e12)
            peak_flops=4.59e14,  # [book]/[docs] 459 TFLOP/s bf16
            ndim=3,
            megacore=True,
        ),
        Chip(
            name="v4",
            device_kind="TPU v4",
            ici_ports=6,  # [docs] v4: 3D torus/mesh, 6 ports
            link_bandwidth=4.5e10,  # [book] 4.5e10 one-way per link
            hbm_bytes=int(30.75 * GiB),  # measured: 32 GiB physical, 30.75G usable
            hbm_bandwidth=1.2e12,  # [book]/[docs] 1200 GB/s
            peak_flops=2.75e14,  # [book]/[docs] 275 TFLOP/s bf16
            ndim=3,
            megacore=True,
        ),
    )
}

# Aliases accepted in topology strings, mapped to the canonical generation name.
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "trillium": "v6e", "v5": "v5p"}


def get_chip(name: str) -> Chip:
    """The `Chip` for a generation name or alias (case-insensitive)."""
    key = ALIASES.get(name.lower(), name.lower())
    try:
        return CHIPS[key]
    except KeyError:
        raise ValueError(
            f"unknown TPU generation {name!r}; known: {sorted(CHIPS)} (aliases {sorted(ALIASES)})"
        ) from None
