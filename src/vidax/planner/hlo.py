"""Parsing compiled HLO text: collectives with their groups and bytes, per-op compute, loops.

`analyze_hlo(compiled.as_text())` walks the module from its entry computation and returns an
`HloAnalysis`:

- `collectives`: every collective that runs, once per distinct instruction, with `count` = how
  many times one step executes it (the product of the trip counts of enclosing while loops),
  its per-device result/operand bytes and its replica groups (or permute pairs) as *logical*
  device ids, i.e. positions in the flattened `Mesh.devices` (`use_global_device_ids=true`);
- `ops`: the compute instructions with FLOPs (dots and convolutions, also inside fusions) and
  HBM bytes (operands read + result written, slices and in-place updates counted at their
  slice size), each with its `count`.

Forms handled:
- replica groups: explicit `{{0,1},{2,3}}`, empty `{}` (all devices), iota
  `[G,S]<=[d0,d1]T(1,0)`, and the mesh-axes form `mesh['a'=4,'b'=4] {'b'}` (with sub-axes
  `'a':(1)2` and explicit `device_ids=(...)`), expanded as XLA's `replica_group.cc` does;
- async collectives: `*-start`/`*-done` pairs, generic `async-start`/`async-done` wrapping a
  collective computation, and the TPU compiler's async collective fusions (a fusion whose root
  is `custom-call "AsyncCollectiveStart"`, continuation fusions that carry the collective while
  other work runs, and an `AsyncCollectiveDone` fusion). The compute scheduled between a start
  and its done is recorded as the collective's overlap window;
- loops: `known_trip_count` in a while's backend config, else the condition's comparison of
  the induction variable with a constant, its initial value and its step. Unknown trip counts
  count once and are flagged (`trip_count_known=False`).

Note: `compiled.cost_analysis()` counts a while body once, whatever its trip count (checked in
the tests on a scanned MLP), which is why FLOPs and bytes are recomputed here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Iterator, Sequence

import numpy as np

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)

_DTYPE_BITS = {
    "pred": 8,
    "s2": 2,
    "u2": 2,
    "s4": 4,
    "u4": 4,
    "s8": 8,
    "u8": 8,
    "s16": 16,
    "u16": 16,
    "s32": 32,
    "u32": 32,
    "s64": 64,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "token": 0,
}
# Opcodes that move no data through HBM (or whose cost is accounted elsewhere).
_FREE_OPS = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "copy-start",
        "copy-done",
        "opt-barrier",
        "add-dependency",
        "while",
        "conditional",
        "call",
        "domain",
        "send",
        "send-done",
        "recv",
        "recv-done",
    }
)
_SLICE_OPS = frozenset({"slice", "dynamic-slice"})
_SHAPE_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")


# ---- shapes ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Shape:
    """One array leaf of an HLO shape (layout dropped)."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.dims) * _dtype_bits(self.dtype) // 8


def _dtype_bits(dtype: str) -> int:
    if dtype in _DTYPE_BITS:
        return _DTYPE_BITS[dtype]
    m = re.match(r"^f(\d+)e", dtype)  # f8e4m3fn, f8e5m2, f4e2m1fn, ...
    if m:
        return int(m.group(1))
    raise ValueError(f"unknown HLO element type {dtype!r}")


def parse_shape(text: str) -> tuple[Shape, ...]:
    """The array leaves of an HLO shape string such as `(f32[2,3]{1,0}, bf16[4])`."""
    text = re.sub(r"/\*.*?\*/", "", text)
    text = re.sub(r"\{[^{}]*\}", "", text)  # layouts (no nesting inside a layout)
    leaves = []
    for dtype, dims in _SHAPE_RE.findall(text):
        if dtype not in _DTYPE_BITS and not re.match(r"^f\d+e", dtype):
            continue
        dims = tuple(int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip())
        leaves.append(Shape(dtype, dims))
    if not leaves and "token" in text:
        leaves.append(Shape("token", ()))
    return tuple(leaves)


# ---- module text -----------------------------------------------------------------------------
@dataclasses.dataclass
class Instruction:
    """One HLO instruction: `name = shape opcode(operands), key=value, ...`."""

    name: str
    opcode: str
    shape_text: str
    operands: tuple[str, ...]
    attrs: dict[str, str]
    raw_operands: str = ""
    is_root: bool = False

    @functools.cached_property
    def shapes(self) -> tuple[Shape, ...]:
        return parse_shape(self.shape_text)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shapes)

    def called(self) -> list[tuple[str, str]]:
        """(attribute, computation name) for every computation this instruction calls."""
        out: list[tuple[str, str]] = []
        for key in (
            "calls",
            "to_apply",
            "condition",
            "body",
            "true_computation",
            "false_computation",
        ):
            if key in self.attrs:
                out.extend((key, n) for n in _names(self.attrs[key]))
        if "branch_computations" in self.attrs:
            out.extend(
                ("branch_computations", n) for n in _names(self.attrs["branch_computations"])
            )
        return out

    @functools.cached_property
    def backend_config(self) -> dict:
        raw = self.attrs.get("backend_config")
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False

    @functools.cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    @functools.cached_property
    def users(self) -> dict[str, list[Instruction]]:
        out: dict[str, list[Instruction]] = {}
        for inst in self.instructions:
            for op in inst.operands:
                out.setdefault(op, []).append(inst)
        return out

    @property
    def root(self) -> Instruction:
        for inst in self.instructions:
            if inst.is_root:
                return inst
        return self.instructions[-1]

    def parameter(self, index: int) -> Instruction | None:
        for inst in self.instructions:
            if inst.opcode == "parameter" and inst.raw_operands.strip() == str(index):
                return inst
        return None


@dataclasses.dataclass
class HloModule:
    name: str
    computations: dict[str, Computation]
    entry: str
    num_partitions: int = 1
    num_replicas: int = 1

    @property
    def num_devices(self) -> int:
        return self.num_partitions * self.num_replicas


def _names(value: str) -> list[str]:
    return [n.lstrip("%") for n in re.findall(r"%?[\w.\-]+", value.strip("{} "))]


def _unquoted(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth after it) of each character of `text` from `start`
    outside double-quoted strings (which may hold backslash escapes and brackets)."""
    depth, quote, i = 0, False, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quote = False
        elif ch == '"':
            quote = True
        else:
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            yield i, ch, depth
        i += 1


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Splits at `sep` outside brackets and quotes."""
    parts, start = [], 0
    for i, ch, depth in _unquoted(text):
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _match_close(text: str, start: int) -> int:
    """Index just past the bracket group opening at `text[start]`."""
    for i, ch, depth in _unquoted(text, start):
        if ch in ")]}" and depth == 0:
            return i + 1
    raise ValueError(f"unbalanced brackets in HLO text: {text[start : start + 80]!r}")


_INST_RE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")


def _parse_instruction(line: str) -> Instruction | None:
    m = _INST_RE.match(line)
    if m is None:
        return None
    rest = line[m.end() :]
    # Shape: a parenthesised tuple, or one token (its layout braces contain no spaces).
    if rest.startswith("("):
        end = _match_close(rest, 0)
    else:
        end, depth = 0, 0
        while end < len(rest) and not (rest[end] == " " and depth == 0):
            depth += rest[end] in "([{"
            depth -= rest[end] in ")]}"
            end += 1
    shape_text, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren <= 0:
        return None
    opcode = rest[:paren].strip()
    close = _match_close(rest, paren)
    raw_operands = rest[paren + 1 : close - 1]
    operands = []
    for part in _split_top(re.sub(r"/\*.*?\*/", "", raw_operands)):
        names = re.findall(r"%([\w.\-]+)", part)
        if names:
            operands.append(names[-1])
        elif re.fullmatch(r"\s*[A-Za-z_][\w.\-]*\s*", part) and opcode not in ("constant",):
            operands.append(part.strip())
    attrs: dict[str, str] = {}
    last: str | None = None
    for part in _split_top(rest[close:]):
        key, eq, value = part.partition("=")
        if last == "replica_groups" and attrs[last].startswith("mesh") and "{" not in attrs[last]:
            # `mesh[...], device_ids=(...) {axes}` has a top-level comma: rejoin it.
            attrs[last] += "," + part
            continue
        if eq:
            last = key.strip()
            attrs[last] = value.strip()
    return Instruction(
        name=m.group(2),
        opcode=opcode,
        shape_text=shape_text,
        operands=tuple(operands),
        attrs=attrs,
        raw_operands=raw_operands,
        is_root=bool(m.group(1)),
    )


_COMP_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*(->.*)?\{\s*$")


def parse_module(text: str) -> HloModule:
    """Parses the text of an HLO module (`compiled.as_text()` or `lowered.as_text("hlo")`)."""
    header = re.search(r"^HloModule\s+([\w.\-]+)(.*)$", text, re.M)
    name = header.group(1) if header else ""
    head = header.group(2) if header else ""
    partitions = re.search(r"num_partitions=(\d+)", head)
    replicas = re.search(r"replica_count=(\d+)", head)
    computations: dict[str, Computation] = {}
    entry = None
    current: Computation | None = None
    for line in text.splitlines():
        if current is None:
            m = _COMP_RE.match(line)
            if m and not line.startswith((" ", "\t")) and not line.startswith("HloModule"):
                current = Computation(m.group(2), [], is_entry=bool(m.group(1)))
            continue
        if line.strip() == "}":
            computations[current.name] = current
            if current.is_entry:
                entry = current.name
            current = None
            continue
        inst = _parse_instruction(line)
        if inst is not None:
            current.instructions.append(inst)
    if entry is None:
        raise ValueError("HLO text has no ENTRY computation")
    return HloModule(
        name=name,
        computations=computations,
        entry=entry,
        num_partitions=int(partitions.group(1)) if partitions else 1,
        num_replicas=int(replicas.group(1)) if replicas else 1,
    )


# ---- replica groups --------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def expand_iota(text: str) -> np.ndarray:
    """Expands an iota list `[G,S]<=[d0,d1,...]T(p0,p1,...)` into a `(G, S)` id array."""
    m = re.fullmatch(r"\s*\[([\d,\s]+)\]\s*<=\s*\[([\d,\s]+)\]\s*(?:T\(([\d,\s]+)\))?\s*", text)
    if m is None:
        raise ValueError(f"not an iota replica-group list: {text!r}")
    out_shape, dims = _ints(m.group(1)), _ints(m.group(2))
    perm = _ints(m.group(3)) if m.group(3) else list(range(len(dims)))
    if sorted(perm) != list(range(len(dims))):
        raise ValueError(f"bad transpose {perm} for iota dims {dims} in {text!r}")
    ids = np.arange(math.prod(dims)).reshape(dims).transpose(perm)
    if math.prod(out_shape) != ids.size:
        raise ValueError(f"iota list {text!r}: {out_shape} does not hold {ids.size} ids")
    return ids.reshape(out_shape)


def _expand_mesh_axes(text: str) -> np.ndarray:
    """Expands `mesh['a'=4,'b'=2](, device_ids=(...)) {'b','a':(1)2}` into groups."""
    m = re.fullmatch(r"\s*mesh\[([^\]]*)\]\s*(?:,\s*device_ids=\((.*)\))?\s*\{(.*)\}\s*", text)
    if m is None:
        raise ValueError(f"not a mesh-axes replica-group list: {text!r}")
    names, sizes = [], []
    for part in _split_top(m.group(1)):
        key, _, size = part.rpartition("=")
        names.append(key.strip().strip("'\""))
        sizes.append(int(size))
    n = math.prod(sizes)
    if m.group(2):
        ids_text = m.group(2).strip()
        ids = expand_iota(ids_text).reshape(-1) if "<=" in ids_text else np.array(_ints(ids_text))
        if ids.size != n:
            raise ValueError(f"mesh device_ids hold {ids.size} ids, mesh has {n}: {text!r}")
    else:
        ids = np.arange(n)
    # Each grouped axis: (mesh dim, pre_size, size); a full axis is (dim, 1, size).
    axes = []
    for part in _split_top(m.group(3)):
        part = part.strip()
        if not part:
            continue
        sub = re.fullmatch(r"['\"]?(.+?)['\"]?:\((\d+)\)(\d+)", part)
        name = sub.group(1) if sub else part.strip("'\"")
        if name not in names:
            raise ValueError(f"axis {name!r} not in mesh axes {names}: {text!r}")
        dim = names.index(name)
        axes.append((dim, int(sub.group(2)), int(sub.group(3))) if sub else (dim, 1, sizes[dim]))
    # Split every mesh dim into [padding, sub-axis, padding, ...] factors (as replica_group.cc),
    # then move the grouped factors last, in the listed order.
    reshape, grouped_index = [], {}
    for dim, full in enumerate(sizes):
        subs = sorted((a for a in axes if a[0] == dim), key=lambda a: a[1])
        prefix = 1
        for a in subs:
            pre, size_a = a[1], a[2]
            if pre != prefix:
                reshape.append(pre // prefix)
                prefix = pre
            grouped_index[a] = len(reshape)
            reshape.append(size_a)
            prefix *= size_a
        if prefix != full or not subs:
            reshape.append(full // prefix)
    grouped = [grouped_index[a] for a in axes]
    rest = [k for k in range(len(reshape)) if k not in grouped]
    group_size = math.prod(reshape[k] for k in grouped)
    return ids.reshape(reshape).transpose(rest + grouped).reshape(-1, group_size)


def parse_replica_groups(text: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    """Replica groups in any printed form, as tuples of logical device ids.

    Args:
        text: the attribute value, e.g. `{{0,1},{2,3}}`, `{}`, `[2,2]<=[4]`,
            `mesh['x'=4] {'x'}`.
        num_devices: devices in the program (an empty list means one group of all of them).
    """
    text = text.strip()
    if text.startswith("mesh"):
        return tuple(tuple(int(x) for x in g) for g in _expand_mesh_axes(text))
    if "<=" in text:
        return tuple(tuple(int(x) for x in g) for g in expand_iota(text))
    if not text.startswith("{"):
        raise ValueError(f"unrecognised replica groups {text!r}")
    groups = tuple(tuple(_ints(g)) for g in re.findall(r"\{([^{}]*)\}", text[1:-1]))
    groups = tuple(g for g in groups if g)
    return groups or (tuple(range(num_devices)),)


def parse_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """`source_target_pairs={{0,1},{1,2}}` as ((0, 1), (1, 2))."""
    pairs = []
    for g in re.findall(r"\{([^{}]*)\}", text.strip()[1:-1]):
        ids = _ints(g)
        if len(ids) != 2:
            raise ValueError(f"bad source-target pair {{{g}}}")
        pairs.append((ids[0], ids[1]))
    return tuple(pairs)


# ---- analysis results ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OpCost:
    """A compute instruction: per-execution FLOPs and HBM bytes, executed `count` times."""

    name: str
    computation: str
    opcode: str
    flops: float
    bytes: float
    count: int

    def time(self, peak_flops: float, hbm_bandwidth: float) -> float:
        """Roofline time of one execution."""
        return max(self.flops / peak_flops, self.bytes / hbm_bandwidth)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of the compiled step.

    Attributes:
        kind: base opcode, one of `COLLECTIVES` (async forms map to their base op).
        name: instruction name (the start op for async forms).
        computation: where it is scheduled.
        result_bytes: per-device bytes of the result (gathered size for all-gather, shard size
            for reduce-scatter, full buffer for all-reduce/all-to-all/permute).
        operand_bytes: per-device bytes of the operands.
        dtype: element type of the first result leaf.
        groups: replica groups as logical device ids (empty for collective-permute).
        pairs: (source, target) logical ids for collective-permute.
        channel_id: the op's channel id, if any.
        global_device_ids: `use_global_device_ids=true` (ids index the device assignment).
        count: executions per step (product of enclosing loop trip counts).
        is_async: whether compute can run between its start and done.
        overlap: indices into `HloAnalysis.ops` of the compute scheduled inside its window.
        trip_count_known: False if an enclosing loop's trip count had to be assumed 1.
    """

    kind: str
    name: str
    computation: str
    result_bytes: int
    operand_bytes: int
    dtype: str
    groups: tuple[tuple[int, ...], ...] = ()
    pairs: tuple[tuple[int, int], ...] = ()
    channel_id: int | None = None
    global_device_ids: bool = False
    count: int = 1
    is_async: bool = False
    overlap: tuple[int, ...] = ()
    trip_count_known: bool = True

    @property
    def group_size(self) -> int:
        return len(self.groups[0]) if self.groups else 2

    @property
    def signature(self) -> tuple:
        """Identity for caching communication costs across identical instructions."""
        return (self.kind, self.result_bytes, self.operand_bytes, self.groups, self.pairs)


@dataclasses.dataclass(frozen=True)
class WhileLoop:
    name: str
    computation: str
    body: str
    trip_count: int
    known: bool


@dataclasses.dataclass(frozen=True)
class HloAnalysis:
    """What one compiled step executes: collectives, compute ops and loops."""

    module: HloModule
    collectives: tuple[Collective, ...]
    ops: tuple[OpCost, ...]
    loops: tuple[WhileLoop, ...]

    @property
    def num_devices(self) -> int:
        return self.module.num_devices

    @property
    def flops(self) -> float:
        return sum(op.flops * op.count for op in self.ops)

    @property
    def bytes(self) -> float:
        return sum(op.bytes * op.count for op in self.ops)

    def compute_time(self, peak_flops: float, hbm_bandwidth: float) -> float:
        """Sum of per-op roofline times, each op counted as often as it executes."""
        return sum(op.time(peak_flops, hbm_bandwidth) * op.count for op in self.ops)

    def collective_bytes(self) -> dict[str, int]:
        """Per-device result bytes by collective kind over one step."""
        out: dict[str, int] = {}
        for c in self.collectives:
            out[c.kind] = out.get(c.kind, 0) + c.result_bytes * c.count
        return out


# ---- analysis --------------------------------------------------------------------------------
def analyze_hlo(text_or_module: str | HloModule) -> HloAnalysis:
    """Walks a compiled HLO module from its entry: collectives, compute ops and loops."""
    module = (
        text_or_module if isinstance(text_or_module, HloModule) else parse_module(text_or_module)
    )
    walker = _Walker(module)
    walker.walk(module.computations[module.entry], 1, True)
    return HloAnalysis(
        module=module,
        collectives=tuple(walker.collectives),
        ops=tuple(walker.ops),
        loops=tuple(walker.loops),
    )


def _base_kind(opcode: str) -> str | None:
    for suffix in ("-start", "-done", "-update"):
        if opcode.endswith(suffix):
            opcode = opcode[: -len(suffix)]
    return opcode if opcode in COLLECTIVES else None


class _Computations(dict):
    def __missing__(self, name):
        raise ValueError(f"HLO text calls computation {name!r}, which it does not define")


class _Walker:
    def __init__(self, module: HloModule):
        self.module = dataclasses.replace(module, computations=_Computations(module.computations))
        self.collectives: list[Collective] = []
        self.ops: list[OpCost] = []
        self.loops: list[WhileLoop] = []

    def _conditional(self, inst: Instruction, count: int, known: bool) -> None:
        """One branch runs per execution (e.g. one of two experts): keep the costliest
        branch's ops and collectives (by FLOPs, then HBM and collective bytes), not the sum of
        all branches."""
        ops, collectives, loops = len(self.ops), len(self.collectives), len(self.loops)
        branches = []
        for _, name in inst.called():
            self.walk(self.module.computations[name], count, known)
            branches.append((self.ops[ops:], self.collectives[collectives:], self.loops[loops:]))
            del self.ops[ops:], self.collectives[collectives:], self.loops[loops:]
        if branches:
            best = max(
                branches,
                key=lambda b: (
                    sum(o.flops * o.count for o in b[0]),
                    sum(o.bytes * o.count for o in b[0]),
                ),
            )
            self.ops.extend(best[0])
            self.collectives.extend(best[1])
            self.loops.extend(best[2])

    # -- computation walk --
    def walk(self, comp: Computation, count: int, known: bool) -> None:
        # Async windows open in this computation: start name -> (partial Collective, first op).
        open_windows: dict[str, tuple[Collective, int]] = {}
        for inst in comp.instructions:
            op = inst.opcode
            kind = _base_kind(op)
            if op == "while":
                self._while(comp, inst, count, known)
            elif op == "conditional":
                self._conditional(inst, count, known)
            elif op == "call":
                for _, name in inst.called():
                    self.walk(self.module.computations[name], count, known)
            elif op == "async-start":
                called = [self.module.computations[n] for k, n in inst.called() if k == "calls"]
                found = [c for sub in called for c in self._fused_collectives(sub)]
                for sub_comp, coll in found:
                    c = self._collective(sub_comp, coll, count, known, is_async=True)
                    open_windows[inst.name] = (
                        dataclasses.replace(c, name=inst.name),
                        len(self.ops),
                    )
            elif op in ("async-done", "async-update") or (
                kind and op.endswith(("-done", "-update"))
            ):
                if op.endswith("-done"):
                    self._close(comp, inst, open_windows)
            elif kind and op.endswith("-start"):
                c = self._collective(comp, inst, count, known, is_async=True)
                open_windows[inst.name] = (c, len(self.ops))
            elif kind:
                self.collectives.append(self._collective(comp, inst, count, known))
            elif op == "fusion":
                self._fusion(comp, inst, count, known, open_windows)
            elif op not in _FREE_OPS and not (
                op == "custom-call"
                and "AsyncCollective" in inst.attrs.get("custom_call_target", "")
            ):
                self._add_op(
                    comp, inst, self._op_flops(comp, inst), self._op_bytes(comp, inst), count
                )
        # A start whose done we never saw: count it without overlap.
        for c, _ in open_windows.values():
            self.collectives.append(c)

    def _close(self, comp: Computation, done: Instruction, open_windows) -> None:
        start = self._trace_start(comp, done, open_windows)
        if start is None:
            return
        c, first = open_windows.pop(start)
        result_bytes = c.result_bytes
        if done.opcode != "async-done" and _base_kind(done.opcode) and done.shapes:
            result_bytes = done.nbytes  # the done's result is the collective's output
        self.collectives.append(
            dataclasses.replace(
                c, result_bytes=result_bytes, overlap=tuple(range(first, len(self.ops)))
            )
        )

    def _trace_start(self, comp: Computation, inst: Instruction, open_windows) -> str | None:
        """The open async start that `inst` (a done) consumes, through tuples/gtes/fusions."""
        seen, stack = set(), list(inst.operands)
        while stack:
            name = stack.pop()
            if name in open_windows:
                return name
            if name in seen or name not in comp.by_name:
                continue
            seen.add(name)
            prev = comp.by_name[name]
            if prev.opcode in ("get-tuple-element", "tuple", "bitcast", "fusion", "copy") or (
                prev.opcode.endswith("-update")
            ):
                stack.extend(prev.operands)
        return None

    def _while(self, comp: Computation, inst: Instruction, count: int, known: bool) -> None:
        body = cond = None
        for key, name in inst.called():
            if key == "body":
                body = self.module.computations[name]
            elif key == "condition":
                cond = self.module.computations[name]
        if body is None:
            raise ValueError(f"while {inst.name!r} has no body computation")
        trip, trip_known = _trip_count(self.module, comp, inst, cond, body)
        self.loops.append(WhileLoop(inst.name, comp.name, body.name, trip, trip_known))
        self.walk(body, count * trip, known and trip_known)
        if cond is not None:
            self.walk(cond, count * (trip + 1), known and trip_known)

    # -- fusions --
    def _fusion(self, comp, inst, count, known, open_windows) -> None:
        names = [n for k, n in inst.called() if k == "calls"]
        fused = self.module.computations[names[0]] if names else None
        if fused is not None:
            for sub_comp, coll in self._fused_collectives(fused):
                role = _async_fusion_role(sub_comp, coll)
                if role == "start":
                    c = self._collective(sub_comp, coll, count, known, is_async=True)
                    open_windows[inst.name] = (
                        dataclasses.replace(c, name=inst.name),
                        len(self.ops),
                    )
                elif role == "done":
                    self._close(comp, inst, open_windows)
                elif role == "sync":
                    self.collectives.append(self._collective(sub_comp, coll, count, known))
                # "continuation": the same in-flight collective; only its compute counts.
        flops = self._comp_flops(fused.name) if fused is not None else 0.0
        nbytes = _fusion_bytes(fused, inst, self.module) if fused is not None else inst.nbytes
        if flops or nbytes:
            self._add_op(comp, inst, flops, nbytes, count)

    def _fused_collectives(self, comp: Computation) -> Iterator[tuple[Computation, Instruction]]:
        for inst in comp.instructions:
            if _base_kind(inst.opcode):
                yield comp, inst
            elif inst.opcode == "fusion":
                for _, name in inst.called():
                    yield from self._fused_collectives(self.module.computations[name])

    # -- collectives --
    def _collective(self, comp, inst, count, known, is_async: bool = False) -> Collective:
        kind = _base_kind(inst.opcode)
        if kind is None:
            raise ValueError(f"{inst.opcode} {inst.name} is not a collective")
        n = self.module.num_devices
        groups: tuple[tuple[int, ...], ...] = ()
        pairs: tuple[tuple[int, int], ...] = ()
        if kind == "collective-permute":
            pairs = parse_pairs(inst.attrs.get("source_target_pairs", "{}"))
        else:
            groups = parse_replica_groups(inst.attrs.get("replica_groups", "{}"), n)
        shapes = inst.shapes
        result_bytes = sum(s.nbytes for s in shapes)
        if inst.opcode.endswith("-start"):
            # Start ops return (operands..., outputs..., context...): take the output half.
            result_bytes = _start_result_bytes(kind, inst)
        operand_bytes = sum(
            comp.by_name[o].nbytes if o in comp.by_name else 0 for o in inst.operands
        )
        channel = inst.attrs.get("channel_id")
        return Collective(
            kind=kind,
            name=inst.name,
            computation=comp.name,
            result_bytes=int(result_bytes),
            operand_bytes=int(operand_bytes),
            dtype=shapes[0].dtype if shapes else "",
            groups=groups,
            pairs=pairs,
            channel_id=int(channel) if channel and channel.isdigit() else None,
            global_device_ids=inst.attrs.get("use_global_device_ids") == "true",
            count=count,
            is_async=is_async,
            trip_count_known=known,
        )

    # -- compute --
    def _add_op(self, comp, inst, flops, nbytes, count) -> None:
        self.ops.append(
            OpCost(inst.name, comp.name, inst.opcode, float(flops), float(nbytes), count)
        )

    @functools.cache  # noqa: B019 - one walker per analysis
    def _comp_flops(self, name: str) -> float:
        comp = self.module.computations[name]
        total = 0.0
        for inst in comp.instructions:
            total += self._op_flops(comp, inst)
            if inst.opcode == "fusion":
                for key, sub in inst.called():
                    if key == "calls":
                        total += self._comp_flops(sub)
        return total

    @staticmethod
    def _op_flops(comp: Computation, inst: Instruction) -> float:
        if inst.opcode == "custom-call":
            cost = kernel_cost(comp, inst)
            return cost[0] if cost else 0.0
        if inst.opcode == "dot":
            lhs = comp.by_name.get(inst.operands[0]) if inst.operands else None
            if lhs is None or not lhs.shapes:
                return 0.0
            contracting = _ints(inst.attrs.get("lhs_contracting_dims", "{}"))
            k = math.prod(lhs.shapes[0].dims[d] for d in contracting)
            return 2.0 * math.prod(inst.shapes[0].dims) * k
        if inst.opcode == "convolution" and len(inst.operands) >= 2:
            rhs = comp.by_name.get(inst.operands[1])
            labels = inst.attrs.get("dim_labels", "")
            if rhs is None or not rhs.shapes or "_" not in labels:
                return 0.0
            kernel_labels = labels.split("_")[1].split("->")[0]
            dims = rhs.shapes[0].dims
            if "o" not in kernel_labels or len(kernel_labels) != len(dims):
                return 0.0
            per_output = math.prod(dims) // dims[kernel_labels.index("o")]
            return 2.0 * math.prod(inst.shapes[0].dims) * per_output
        return 0.0

    @staticmethod
    def _op_bytes(comp: Computation, inst: Instruction) -> float:
        if inst.opcode == "custom-call":
            cost = kernel_cost(comp, inst)
            if cost:
                return cost[1]
        if inst.opcode in _SLICE_OPS:
            return 2.0 * inst.nbytes
        if inst.opcode == "dynamic-update-slice" and len(inst.operands) >= 2:
            update = comp.by_name.get(inst.operands[1])
            return 2.0 * (update.nbytes if update else inst.nbytes)
        read = sum(comp.by_name[o].nbytes for o in set(inst.operands) if o in comp.by_name)
        return float(read + inst.nbytes)


# Pallas TPU kernels appear as opaque `tpu_custom_call`s that XLA's cost analysis prices at 0
# FLOPs. Kernels whose instruction name starts with one of these prefixes are attention over
# (..., l, k) queries and (..., s, k) keys/values.
_ATTENTION_KERNELS = ("splash_mha_fwd", "splash_mqa_fwd", "flash_attention")
_ATTENTION_Q_BLOCK = 512  # keys/values are re-read once per query block of this many rows


def kernel_cost(comp: Computation, inst: Instruction) -> tuple[float, float] | None:
    """(FLOPs, HBM bytes) of a Pallas TPU kernel call, or None if unknown.

    A `cost_estimate` in the call's backend config (`pl.CostEstimate`) is used as given. jax's
    splash attention sets none, so attention kernels are priced from their operands:
    4*l*s*k FLOPs per (batch, head) and q, o plus k, v once per query block of HBM traffic.
    """
    if inst.attrs.get("custom_call_target", "").strip('"') != "tpu_custom_call":
        return None
    estimate = inst.backend_config.get("custom_call_config", {})
    estimate = estimate.get("cost_estimate") if isinstance(estimate, dict) else None
    if isinstance(estimate, dict) and "flops" in estimate:
        return float(estimate["flops"]), float(estimate.get("bytes_accessed", 0.0))
    if not inst.name.lstrip("%").startswith(_ATTENTION_KERNELS):
        return None
    arrays = [
        comp.by_name[o].shapes[0]
        for o in inst.operands
        if o in comp.by_name
        and comp.by_name[o].shapes
        and len(comp.by_name[o].shapes[0].dims) >= 3
        and comp.by_name[o].shapes[0].dtype.startswith(("bf", "f"))
    ]
    if len(arrays) < 3:
        return None
    q, k, v = arrays[:3]
    length, d = q.dims[-2], q.dims[-1]
    s = k.dims[-2]
    rows = math.prod(q.dims[:-1])  # batch * heads * l
    flops = 4.0 * rows * s * d
    q_blocks = -(-length // _ATTENTION_Q_BLOCK)
    nbytes = 2.0 * q.nbytes + q_blocks * (k.nbytes + v.nbytes)
    return flops, nbytes


def _start_result_bytes(kind: str, inst: Instruction) -> int:
    shapes = inst.shapes
    if not inst.shape_text.startswith("(") or kind == "all-reduce":
        return sum(s.nbytes for s in shapes)
    arrays = [s for s in shapes if s.dims or s.dtype not in ("u32", "s32")]
    half = len(arrays) // 2
    return sum(s.nbytes for s in arrays[half:]) if half else sum(s.nbytes for s in arrays)


def _async_fusion_role(comp: Computation, coll: Instruction) -> str:
    """How a collective inside a TPU async collective fusion should be counted."""
    for user in comp.users.get(coll.name, ()):
        target = user.attrs.get("custom_call_target", "")
        if user.opcode == "custom-call" and "AsyncCollectiveStart" in target:
            return "start"
        if user.opcode == "custom-call" and "AsyncCollectiveDone" in target:
            return "done"
    if "async_collective_fusion_config" in coll.attrs.get("backend_config", ""):
        return "continuation"
    return "sync"


def _fusion_bytes(fused: Computation, inst: Instruction, module: HloModule | None = None) -> float:
    """HBM bytes of one fusion: parameters it reads plus results it writes.

    Parameters only passed through (to the root tuple, an async-collective custom call or a
    collective) are not read; parameters only sliced are read at slice size, also through
    bitcasts/reshapes and nested fusions (a scanned layer's matmul fusion takes the whole
    stacked weight and slices its layer in a nested loop fusion); a root dynamic-update-slice
    writes its update in place.
    """
    in_place = set()
    root = fused.root
    written = 0.0
    roots = (
        [fused.by_name[o] for o in root.operands if o in fused.by_name]
        if (root.opcode == "tuple")
        else [root]
    )
    for r in roots:
        if r.opcode == "dynamic-update-slice" and len(r.operands) >= 2:
            in_place.add(r.operands[0])
            update = fused.by_name.get(r.operands[1])
            written += update.nbytes if update else r.nbytes
        elif r.opcode not in ("parameter", "custom-call", "get-tuple-element") and not _base_kind(
            r.opcode
        ):
            written += r.nbytes
    read = 0.0
    for p in fused.instructions:
        if p.opcode != "parameter" or p.name in in_place:
            continue
        read += _read_bytes(fused, p, module, depth=0)
    return read + written


_PASSTHROUGH = frozenset({"tuple", "custom-call", *COLLECTIVES})
_VIEWS = frozenset({"bitcast", "reshape"})


def _read_bytes(comp: Computation, value: Instruction, module, depth: int) -> float:
    """Bytes of `value` (a fused parameter or a view of one) that its users read from HBM."""
    users = [u for u in comp.users.get(value.name, ()) if _base_kind(u.opcode) is None]
    users = [u for u in users if u.opcode not in _PASSTHROUGH]
    if not users:
        return 0.0
    total = 0.0
    for u in users:
        if u.opcode in _SLICE_OPS:
            total += u.nbytes
        elif u.opcode in _VIEWS and depth < 8:
            total += _read_bytes(comp, u, module, depth + 1)
        elif u.opcode == "fusion" and module is not None and depth < 8:
            names = [n for k, n in u.called() if k == "calls"]
            inner = module.computations.get(names[0]) if names else None
            if inner is None:
                return float(value.nbytes)
            for k, operand in enumerate(u.operands):
                param = inner.parameter(k) if operand == value.name else None
                if param is not None:
                    total += _read_bytes(inner, param, module, depth + 1)
        else:
            return float(value.nbytes)  # read whole (once, however many users)
    return min(total, float(value.nbytes))


# ---- loop trip counts ------------------------------------------------------------------------
def _trip_count(
    module: HloModule,
    comp: Computation,
    inst: Instruction,
    cond: Computation | None,
    body: Computation | None,
) -> tuple[int, bool]:
    known = inst.backend_config.get("known_trip_count", {})
    if isinstance(known, dict) and str(known.get("n", "")).lstrip("-").isdigit():
        return int(known["n"]), True
    if cond is None or body is None:
        return 1, False
    found = _loop_bound(module, cond)
    if found is None:
        return 1, False
    index, bound, direction, var_on_left = found
    init = _tuple_constant(comp, inst.operands[0] if inst.operands else "", index)
    step = _body_step(body, index)
    if init is None:
        init = 0
    if step is None or step == 0:
        return 1, False
    if not var_on_left:  # `bound OP var` -> `var OP' bound`
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    span = bound - init
    if direction == "LT":
        trips = -(-span // step) if step > 0 else 0
    elif direction == "LE":
        trips = span // step + 1 if step > 0 else 0
    elif direction == "GT":
        trips = -(span // -step) if step < 0 else 0
    elif direction == "GE":
        trips = (-span) // (-step) + 1 if step < 0 else 0
    elif direction == "NE":
        trips = span // step if span % step == 0 and span // step >= 0 else 0
    else:
        return 1, False
    return max(int(trips), 0), True


def _loop_bound(module: HloModule, cond: Computation):
    """(tuple index, bound, direction, induction variable on the left) of a loop condition."""
    comp, root = cond, cond.root
    mapping: dict[str, Instruction] = {}
    if root.opcode == "fusion":  # the compare may be fused: map fused params to cond operands
        names = [n for k, n in root.called() if k == "calls"]
        inner = module.computations[names[0]]
        for k, operand in enumerate(root.operands):
            p = inner.parameter(k)
            if p is not None and operand in cond.by_name:
                mapping[p.name] = cond.by_name[operand]
        comp, root = inner, inner.root
    if root.opcode != "compare" or len(root.operands) != 2:
        return None

    def resolve(name: str) -> Instruction | None:
        inst = mapping.get(name) or comp.by_name.get(name) or cond.by_name.get(name)
        while inst is not None and inst.opcode in ("copy", "bitcast", "convert"):
            src = inst.operands[0]
            inst = mapping.get(src) or comp.by_name.get(src) or cond.by_name.get(src)
        return inst

    a, b = (resolve(o) for o in root.operands)
    direction = root.attrs.get("direction", "")

    def gte_index(x: Instruction | None) -> int | None:
        if x is not None and x.opcode == "get-tuple-element":
            return int(x.attrs.get("index", "-1"))
        return None

    def const(x: Instruction | None) -> int | None:
        if x is not None and x.opcode == "constant":
            vals = _ints(x.raw_operands)
            return vals[0] if len(vals) == 1 else None
        return None

    if gte_index(a) is not None and const(b) is not None:
        return gte_index(a), const(b), direction, True
    if gte_index(b) is not None and const(a) is not None:
        return gte_index(b), const(a), direction, False
    return None


def _tuple_constant(comp: Computation, name: str, index: int) -> int | None:
    tup = _through(comp, name)
    if tup is None or tup.opcode != "tuple" or index >= len(tup.operands):
        return None
    inst = _through(comp, tup.operands[index])
    if inst is not None and inst.opcode == "constant":
        vals = _ints(inst.raw_operands)
        return vals[0] if len(vals) == 1 else None
    return None


def _through(comp: Computation, name: str) -> Instruction | None:
    """The instruction behind `name`, looking through copies, bitcasts and converts."""
    inst = comp.by_name.get(name)
    while inst is not None and inst.opcode in ("copy", "bitcast", "convert") and inst.operands:
        inst = comp.by_name.get(inst.operands[0])
    return inst


def _body_step(body: Computation, index: int) -> int | None:
    root = body.root
    if root.opcode != "tuple" or index >= len(root.operands):
        return None
    upd = _through(body, root.operands[index])
    if upd is None or upd.opcode not in ("add", "subtract") or len(upd.operands) != 2:
        return None
    vals = []
    var_ok = False
    for o in upd.operands:
        x = _through(body, o)
        if x is None:
            return None
        if x.opcode == "constant":
            v = _ints(x.raw_operands)
            vals.append(v[0] if len(v) == 1 else None)
        elif x.opcode == "get-tuple-element" and int(x.attrs.get("index", "-1")) == index:
            var_ok = True
    if not var_ok or len(vals) != 1 or vals[0] is None:
        return None
    return vals[0] if upd.opcode == "add" else -vals[0]


def groups_of(collectives: Sequence[Collective]) -> set[tuple[tuple[int, ...], ...]]:
    """The distinct replica-group sets used by `collectives` (permutes excluded)."""
    return {c.groups for c in collectives if c.groups}
