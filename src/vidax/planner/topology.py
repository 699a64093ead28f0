"""Physical TPU slices: topology strings, compile-only devices, ICI links and routing.

A slice is a box of chips with integer coordinates `(x, y)` (v5e/v6e) or `(x, y, z)` (v4/v5p).
Each chip has a directed ICI link to its neighbour at +-1 along every dimension; wrap-around
links exist only where the slice closes a ring:

- v5e/v6e: on an axis of 16 chips (MaxText `wrap`: 4x4/4x8/8x8 none, 8x16 on y, 16x16 both;
  the scaling book: "no wraparound on axes of fewer than 16 chips").
- v4/v5p: on every axis when all dimensions are multiples of 4 (whole 4x4x4 cubes joined by
  optical switches); smaller slices such as 2x2x4 have none.

Chips are indexed x-fastest (`i = x + X*(y + Y*z)`), which on compile-only v5e devices equals
`device.id`. Messages follow dimension-order routing (x, then y, then z), going the shorter way
round on wrapped axes (a message exactly half-way round is split over both directions), as a
simple deterministic stand-in for the ICI router.

    topo = load_topology("v5e:4x4")          # needs libtpu, no TPU
    topo.route(0, 15)                         # link ids from chip (0,0) to (3,3)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import math
import os
import re
from collections.abc import Sequence

import numpy as np

from vidax.errors import MissingExtraError
from vidax.planner.hardware import Chip, get_chip
from vidax.runtime import quiet_native_stderr

# Slice shapes each generation offers ([docs] supported slice shapes; [maxtext] spec map).
_2D_SHAPES = ((1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16))
_3D_SMALL_SHAPES = ((2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4))
_TOPOLOGY_RE = re.compile(r"^\s*([A-Za-z0-9_ ]+?)\s*[:=_-]\s*(\d+(?:x\d+)*)\s*$")


def parse_topology(name: str) -> tuple[Chip, tuple[int, ...]]:
    """Parses `"v5e:4x4"` / `"v5p:2x2x4"` into the chip and the slice dimensions.

    Raises:
        ValueError: for an unknown generation, a malformed string, or a shape the
            generation does not offer (e.g. `"v5e:3x3"`, `"v5e:4x4x4"`, `"v5p:4x4"`).
    """
    match = _TOPOLOGY_RE.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"bad topology string {name!r}: expected '<generation>:<AxB[xC]>', e.g. 'v5e:4x4'"
        )
    chip = get_chip(match.group(1))
    dims = tuple(int(d) for d in match.group(2).split("x"))
    if chip.ndim == 2:
        if dims not in _2D_SHAPES:
            raise ValueError(
                f"{chip.name} has no {'x'.join(map(str, dims))} slice; "
                f"choose from {', '.join('x'.join(map(str, s)) for s in _2D_SHAPES)}"
            )
    elif not (
        dims in _3D_SMALL_SHAPES
        or (
            len(dims) == 3
            and all(d % 4 == 0 and d > 0 for d in dims)
            and list(dims) == sorted(dims)
        )
    ):
        raise ValueError(
            f"{chip.name} has no {'x'.join(map(str, dims))} slice; choose one of "
            f"{', '.join('x'.join(map(str, s)) for s in _3D_SMALL_SHAPES)} or AxBxC with "
            "A<=B<=C all multiples of 4 (whole cubes)"
        )
    return chip, dims


def wrap_around(chip: Chip, dims: Sequence[int]) -> tuple[bool, ...]:
    """Which slice dimensions have wrap-around links (see the module docstring)."""
    if chip.ndim == 2:
        return tuple(d == 16 for d in dims)
    full_cubes = all(d % 4 == 0 for d in dims)
    return tuple(full_cubes and d > 1 for d in dims)


def _xyz(coord) -> tuple[int, int, int]:
    """A chip coordinate of 1-3 dims as (x, y, z), missing dims 0."""
    x, y, z = (*(int(c) for c in coord), 0, 0, 0)[:3]
    return x, y, z


@dataclasses.dataclass(frozen=True)
class _SyntheticDevice:
    """Stands in for a compile-only device where libtpu is absent (planning without it).

    Carries the attributes `jax.experimental.mesh_utils` reads, so jax's default placement
    can still be computed.
    """

    id: int
    coords: tuple[int, int, int]
    device_kind: str
    core_on_chip: int = 0
    platform: str = "tpu"
    process_index: int = 0
    slice_index: int = 0


class Topology:
    """A TPU slice: chips, their coordinates, directed ICI links and routes between them.

    Args:
        chip: the generation's constants.
        dims: slice dimensions `(X, Y[, Z])`.
        devices: one device per chip (compile-only jax devices, or synthetic ones), in any
            order; they are sorted into chip-index order. None builds synthetic devices.
        name: the topology string, for messages.
    """

    def __init__(self, chip: Chip, dims: Sequence[int], devices=None, *, name: str = ""):
        self.chip = chip
        self.dims = tuple(int(d) for d in dims)
        self.ndim = len(self.dims)
        self.wrap = wrap_around(chip, self.dims)
        self.name = name or f"{chip.name}:{'x'.join(map(str, self.dims))}"
        n = math.prod(self.dims)
        # coords[i] = (x, y[, z]) of chip i, x fastest.
        self.coords = np.stack(
            np.unravel_index(np.arange(n), self.dims[::-1])[::-1], axis=-1
        ).astype(np.int64)
        if devices is None:
            devices = [
                _SyntheticDevice(
                    id=i,
                    coords=_xyz(self.coords[i]),
                    device_kind=chip.device_kind,
                )
                for i in range(n)
            ]
        self.devices = self._sort_devices(list(devices))
        self.synthetic = isinstance(self.devices[0], _SyntheticDevice)

    def _sort_devices(self, devices: list) -> tuple:
        n = self.num_devices
        if len(devices) != n:
            raise ValueError(
                f"topology {self.name} has {n} chips but {len(devices)} devices were given "
                "(v4/v5p need megacore mode: one device per chip)"
            )
        slots: list = [None] * n
        for d in devices:
            c = tuple(d.coords)
            if any(c[k] != 0 for k in range(self.ndim, len(c))) or len(c) < self.ndim:
                raise ValueError(f"device {d} has coords {c} outside a {self.ndim}D slice")
            c = c[: self.ndim]
            if any(not 0 <= c[k] < self.dims[k] for k in range(self.ndim)):
                raise ValueError(f"device {d} has coords {c} outside slice dims {self.dims}")
            i = self.index(c)
            if slots[i] is not None:
                raise ValueError(f"devices {slots[i]} and {d} share coords {c}")
            slots[i] = d
        return tuple(slots)

    @property
    def num_devices(self) -> int:
        return math.prod(self.dims)

    def index(self, coord: Sequence[int]) -> int:
        """Chip index of a coordinate tuple."""
        i = 0
        for k in reversed(range(self.ndim)):
            i = i * self.dims[k] + int(coord[k])
        return i

    # ---- links -------------------------------------------------------------------------------
    @property
    def num_link_slots(self) -> int:
        """Size of a per-link array; slot `(i*ndim + dim)*2 + (0 for +, 1 for -)`."""
        return self.num_devices * self.ndim * 2

    def link_id(self, chip: int, dim: int, step: int) -> int:
        return (chip * self.ndim + dim) * 2 + (0 if step > 0 else 1)

    def neighbor(self, chip: int, dim: int, step: int) -> int | None:
        """The chip one hop from `chip` along `dim` in direction `step` (+1/-1), if linked."""
        c = list(self.coords[chip])
        size = self.dims[dim]
        nxt = c[dim] + step
        if 0 <= nxt < size:
            c[dim] = nxt
        elif self.wrap[dim] and size > 2:
            c[dim] = nxt % size
        else:
            return None
        return self.index(c)

    @functools.cached_property
    def links(self) -> tuple[tuple[int, int, int], ...]:
        """Every directed link as `(link_id, src_chip, dst_chip)`."""
        out = []
        for i in range(self.num_devices):
            for dim in range(self.ndim):
                for step in (1, -1):
                    j = self.neighbor(i, dim, step)
                    if j is not None and j != i:
                        out.append((self.link_id(i, dim, step), i, j))
        return tuple(out)

    def link_endpoints(self, link: int) -> tuple[int, int]:
        chip, rest = divmod(link, self.ndim * 2)
        dim, direction = divmod(rest, 2)
        j = self.neighbor(chip, dim, 1 if direction == 0 else -1)
        if j is None:
            raise ValueError(f"link slot {link} is not a link of {self.name}")
        return chip, j

    # ---- routing -----------------------------------------------------------------------------
    def _steps(self, dim: int, a: int, b: int) -> tuple[int, int]:
        """(direction, hop count) from coordinate a to b along one dimension."""
        size = self.dims[dim]
        if a == b:
            return 1, 0
        if self.wrap[dim]:
            fwd = (b - a) % size
            return (1, fwd) if fwd <= size - fwd else (-1, size - fwd)
        return (1, b - a) if b > a else (-1, a - b)

    def hops(self, src: int, dst: int) -> int:
        """Number of ICI hops on the route from chip `src` to chip `dst`."""
        return sum(
            self._steps(k, self.coords[src][k], self.coords[dst][k])[1] for k in range(self.ndim)
        )

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids of the dimension-order route from chip `src` to chip `dst`."""
        return self._route(int(src), int(dst))

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019 - topologies are few and long-lived
    def _route(self, src: int, dst: int, flip: tuple[bool, ...] = ()) -> tuple[int, ...]:
        path = []
        cur = src
        for dim in range(self.ndim):
            step, count = self._steps(dim, self.coords[cur][dim], self.coords[dst][dim])
            if flip and flip[dim]:
                step, count = -step, self.dims[dim] - count
            for _ in range(count):
                path.append(self.link_id(cur, dim, step))
                nxt = self.neighbor(cur, dim, step)
                assert nxt is not None  # `_steps` walks only along links
                cur = nxt
        assert cur == dst
        return tuple(path)

    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019
    def routes(self, src: int, dst: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        """(path, share) pairs: a message exactly half-way round a wrapped ring is split
        evenly between both directions (one path with share 1 otherwise)."""
        ties = [
            k
            for k in range(self.ndim)
            if self.wrap[k]
            and self.dims[k] % 2 == 0
            and (self.coords[dst][k] - self.coords[src][k]) % self.dims[k] == self.dims[k] // 2
        ]
        if not ties:
            return ((self._route(src, dst), 1.0),)
        out = []
        for choice in itertools.product((False, True), repeat=len(ties)):
            flip = [False] * self.ndim
            for k, f in zip(ties, choice, strict=True):
                flip[k] = f
            out.append((self._route(src, dst, tuple(flip)), 1.0 / 2 ** len(ties)))
        return tuple(out)

    def __repr__(self) -> str:
        wraps = "".join("T" if w else "F" for w in self.wrap)
        kind = "synthetic" if self.synthetic else "compile-only"
        return f"Topology({self.name!r}, wrap={wraps}, {self.num_devices} {kind} devices)"


def synthetic_topology(name: str) -> Topology:
    """A `Topology` with stand-in devices: plans and scores without libtpu, cannot compile."""
    chip, dims = parse_topology(name)
    return Topology(chip, dims, name=name)


def load_topology(name: str) -> Topology:
    """A `Topology` over compile-only TPU devices from `jax.experimental.topologies`.

    Needs the `libtpu` package (no TPU): programs can be lowered and compiled for these devices
    on a CPU host.

    Raises:
        ValueError: for a bad topology string.
        MissingExtraError: when libtpu is missing.
        RuntimeError: when libtpu refuses the topology.
    """
    chip, dims = parse_topology(name)
    if importlib.util.find_spec("libtpu") is None:
        raise MissingExtraError(
            f"load_topology({name!r}) needs the `libtpu` package to create compile-only TPU "
            "devices: pip install 'vidax[tpu]' (or use synthetic_topology to plan without it)"
        )
    # Compile-only use never touches a TPU, so other processes holding libtpu (tests, another
    # planner, a TPU job) are no conflict: skip libtpu's one-process lock file.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    libtpu_name = f"{chip.name}:{'x'.join(map(str, dims))}"
    kwargs = {"chip_config_name": "megacore"} if chip.megacore else {}
    try:
        with quiet_native_stderr():  # libtpu's start-up lines, on a host without a TPU
            desc = topologies.get_topology_desc(libtpu_name, "tpu", **kwargs)
    except Exception as e:  # libtpu raises JaxRuntimeError with an opaque status
        # A user error in the CLI's terms (one line): a topology this libtpu does not build.
        raise ValueError(f"libtpu could not build topology {libtpu_name!r}: {e}") from e
    return Topology(chip, dims, desc.devices, name=name)
