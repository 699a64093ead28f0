"""The content-aware selector: which grids to run, and for how many steps, for one video.

1. **Probe.** The first steps of the base schedule run on the coarsest grid (`Policy.probe`
   of the steps, a few percent of the compute); their last update returns the clean prediction
   x0 (`vidax.dvg.sampler.probe`). When one schedule wins whatever the signals (`settled`:
   e.g. the budget affords only one), no probe runs and its steps are saved.
2. **Signals** of that x0 (`measure`), both scale-free ratios in [0, 1]:
   - motion m: the mean energy of temporal differences of x0, as a fraction of its variance
     (0 for a still scene, about 1 for unrelated frames);
   - detail d: the spatial spectral energy above half the Nyquist frequency (in either axis), as
     a fraction of the non-DC energy: what a 2x coarser grid cannot represent, measured at the
     finest scale the probe sees (a self-similar spectrum puts the same fraction one scale up).
3. **Candidates.** Ladders of nested grids ending at full resolution: spatial-only
   (1, s) -> (1, 1), temporal-only (t, 1) -> (1, 1), joint (t, s) -> (1, 1) and the joint ladders
   that restore one axis first, with 2x/4x/8x factors that divide the latent and keep at least
   `Policy.min_tokens` tokens across each spatial axis (a frame of one token has no spatial
   structure for attention to work with); for each ladder, every split of the steps that costs
   at most the budget, in token-steps: sum over stages of steps x grid size, as a fraction of
   the full run (DVG's cost proxy; the FLOP saving is larger because attention is quadratic in
   the tokens, see `vidax.dvg.cost`).
4. **Predicted loss** of a candidate. A grid reduced by f along an axis cannot represent a
   share L(f) of the signal's energy there. The signals measure it one octave down
   (L_t(2) = m, L_s(2) = d); assuming a self-similar spectrum (each octave loses the same share
   of what is left), L(f) = 1 - (1 - x)^log2(f) with x = m or d. A transition from grid A to
   the finer grid B at re-noise level sigma' leaves the band B can represent and A could not,
   L(A) - L(B), as interpolation error in the latent. The next stage repaints what the noise
   drowns; what survives is the signal share kappa(sigma') = (1 - sigma')^2 / ((1 - sigma')^2 +
   sigma'^2). So

       loss = sum over transitions of kappa(sigma') * (w_t (L_t(A) - L_t(B))
                                                        + w_s (L_s(A) - L_s(B)) + w_0 (g_A - g_B)),

   g the fraction of all samples a grid drops (a small content-independent term).

   The selector picks the feasible candidate with the smallest predicted loss (cheaper on
   ties), or no reduction when even that loss exceeds `Policy.tolerance`. A still scene (m ~ 0)
   gets the strongest temporal reduction the budget allows; fast motion keeps its frames and
   reduces space. The weights are fixed (one default policy, never per video); the budget is
   the only user preference.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from vidax.dvg.schedule import Schedule, Stage, reduced_shape
from vidax.sampling import shift_sigmas

FAMILIES = ("none", "spatial", "temporal", "joint")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """The selector's fixed constants (one default policy; not a per-video knob).

    Attributes:
      probe: fraction of the steps the probe runs on the coarsest grid (at least one step).
      motion_weight / detail_weight: w_t, w_s of the predicted loss.
      base_weight: w_0, a content-independent share of every dropped sample (the model is
        trained at full resolution only); it also breaks ties towards spending the budget on
        quality when the content predicts no loss.
      tolerance: predicted loss above which no reduction is chosen.
      min_full: minimum fraction of the steps at full resolution (at least one step).
      factors: reduction factors to consider per axis (those dividing the latent are used).
      min_tokens: tokens a reduced grid keeps at least across each spatial axis.
      default_signals: (motion, detail) assumed without a probe (fixed strategies).
      spatial: whether spatial (and joint) reductions are candidates. DVG assumes a DiT that
        denoises a coarser grid consistently, i.e. one trained at several resolutions; for a
        DiT trained at one resolution (the shipped `tiny`) spatial stages ruin the video, so
        its preset sets this False (`ModelSpec.dvg_spatial`, docs/dvg.md §6.1).
    """

    probe: float = 0.25
    motion_weight: float = 1.0
    detail_weight: float = 1.0
    base_weight: float = 0.01
    tolerance: float = math.inf
    min_full: float = 0.1
    factors: tuple[int, ...] = (2, 4, 8)
    min_tokens: int = 2
    default_signals: tuple[float, float] = (0.5, 0.5)
    spatial: bool = True

    def __post_init__(self):
        if not 0 < self.probe < 1:
            raise ValueError(f"Policy.probe must be in (0, 1), got {self.probe}")
        if not 0 <= self.min_full < 1:
            raise ValueError(f"Policy.min_full must be in [0, 1), got {self.min_full}")
        if min(self.motion_weight, self.detail_weight, self.base_weight) < 0:
            raise ValueError("Policy weights must be >= 0")
        if not self.factors or any(f < 2 for f in self.factors):
            raise ValueError(f"Policy.factors must be ints >= 2, got {self.factors}")
        if self.min_tokens < 1:
            raise ValueError(f"Policy.min_tokens must be >= 1, got {self.min_tokens}")

    def probe_steps(self, num_steps: int) -> int:
        return max(1, min(num_steps - 1, round(self.probe * num_steps)))


DEFAULT_POLICY = Policy()


# -- signals --------------------------------------------------------------------------------------


@jax.jit
def measure(x0: Float[Array, "b t h w c"]) -> Float[Array, "b 2"]:
    """(motion, detail) of each video's clean prediction (see the module docstring).

    Args:
      x0: (b, t, h, w, c) latent.

    Returns:
      (b, 2) float32: motion energy and high-frequency detail, each in [0, 1].
    """
    x = x0.astype(jnp.float32)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    var = x.var(axis=(1, 2, 3), keepdims=True)
    z = (x - mean) * jax.lax.rsqrt(var + 1e-12)
    if z.shape[1] > 1:
        motion = 0.5 * jnp.mean(jnp.square(z[:, 1:] - z[:, :-1]), axis=(1, 2, 3, 4))
    else:
        motion = jnp.zeros(z.shape[0], jnp.float32)
    frames = z - z.mean(axis=(2, 3), keepdims=True)
    power = jnp.square(jnp.abs(jnp.fft.fft2(frames, axes=(2, 3))))
    fy = jnp.abs(jnp.fft.fftfreq(z.shape[2]))[:, None]
    fx = jnp.abs(jnp.fft.fftfreq(z.shape[3]))[None, :]
    high = (jnp.maximum(fy, fx) >= 0.25)[None, None, :, :, None]
    total = power.sum(axis=(1, 2, 3, 4))
    detail = jnp.where(high, power, 0.0).sum(axis=(1, 2, 3, 4)) / (total + 1e-12)
    return jnp.clip(jnp.stack([motion, detail], axis=-1), 0.0, 1.0)


# -- candidates -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A schedule the selector can choose, with its family and relative cost."""

    family: str
    schedule: Schedule
    cost: float


@dataclasses.dataclass(frozen=True)
class Choice:
    """The selector's decision for one video."""

    family: str
    schedule: Schedule
    cost: float
    predicted_loss: float
    signals: tuple[float, float] | None


def ladders(
    latent: tuple[int, int, int],
    patch: tuple[int, int, int] = (1, 1, 1),
    policy: Policy = DEFAULT_POLICY,
) -> dict[str, list[tuple[tuple[int, int], ...]]]:
    """Grid ladders (coarse to fine, ending at (1, 1)) per family for a (t, h, w) latent.

    A factor is used when it divides the latent and leaves at least two frames (temporal) or
    `policy.min_tokens` patches across (spatial); with `policy.spatial` False there are no
    spatial factors (so no spatial or joint ladders).
    """
    t, h, w = latent
    k = policy.min_tokens
    ts = [f for f in policy.factors if t > 1 and (t - 1) % f == 0]
    ss = [f for f in policy.factors if policy.spatial and h % f == 0 and w % f == 0]
    ss = [f for f in ss if h // f >= k * patch[1] and w // f >= k * patch[2]]
    out: dict[str, list] = {"none": [((1, 1),)], "spatial": [], "temporal": [], "joint": []}

    def refine(f, options):
        return [g for g in options if g < f and f % g == 0]

    for fs in ss:
        out["spatial"].append(((1, fs), (1, 1)))
        out["spatial"] += [((1, fs), (1, g), (1, 1)) for g in refine(fs, ss)]
    for ft in ts:
        out["temporal"].append(((ft, 1), (1, 1)))
        out["temporal"] += [((ft, 1), (g, 1), (1, 1)) for g in refine(ft, ts)]
    for ft, fs in itertools.product(ts, ss):
        out["joint"] += [
            ((ft, fs), (1, 1)),
            ((ft, fs), (1, fs), (1, 1)),
            ((ft, fs), (ft, 1), (1, 1)),
        ]
        out["joint"] += [((ft, fs), (g, fs), (1, 1)) for g in refine(ft, ts)]
        out["joint"] += [((ft, fs), (ft, g), (1, 1)) for g in refine(fs, ss)]
    return out


def _splits(num_grids: int, num_steps: int, min_last: int):
    """All step counts (n_1, ..., n_k) >= 1 summing to num_steps with n_k >= min_last."""
    if num_grids == 1:
        yield (num_steps,)
        return
    for head in itertools.product(range(1, num_steps), repeat=num_grids - 1):
        last = num_steps - sum(head)
        if last >= max(1, min_last):
            yield (*head, last)


def candidates(
    latent: tuple[int, int, int],
    patch: tuple[int, int, int],
    num_steps: int,
    budget: float,
    step_cost: Callable[[tuple[int, int, int]], float] = math.prod,
    *,
    policy: Policy = DEFAULT_POLICY,
    families: Sequence[str] = FAMILIES,
    probe: Stage | None = None,
) -> list[Candidate]:
    """Every schedule of the allowed families whose relative cost is within the budget.

    Args:
      latent: full (t, h, w).
      patch: the DiT's patch (reduced grids keep at least one patch).
      num_steps: N, the base sampler's steps.
      budget: maximum cost as a fraction of the full sampler (1 admits only "none").
      step_cost: cost of one step on a (t', h', w') latent; default: its size, i.e. the budget
        counts token-steps (DVG's convention; attention makes the FLOP saving larger on big
        grids). `functools.partial(vidax.dvg.step_flops, config)` budgets FLOPs instead.
      policy: factors and minimum full-resolution steps.
      families: subset of `FAMILIES`.
      probe: the probe's stage, already paid for: its cost is added to every candidate that
        does not start with it (one that does resumes from the probe).

    Returns:
      Candidates (possibly empty), "none" included when allowed and budget >= 1.
    """
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)}; choose from {FAMILIES}")
    full = step_cost(latent)
    min_last = max(1, math.ceil(policy.min_full * num_steps))
    probe_cost = 0.0
    if probe is not None:
        probe_cost = probe.steps * step_cost(reduced_shape(latent, probe.factors)) / full
        probe_cost /= num_steps
    out = []
    for family, family_ladders in ladders(latent, patch, policy).items():
        if family not in families:
            continue
        for ladder in family_ladders:
            costs = [step_cost(reduced_shape(latent, f)) / full for f in ladder]
            for split in _splits(len(ladder), num_steps, min_last):
                cost = sum(c * n for c, n in zip(costs, split, strict=True)) / num_steps
                if probe is not None and (*ladder[0], split[0]) != (*probe.factors, probe.steps):
                    cost += probe_cost
                if cost <= budget + 1e-9:
                    stages = tuple((*f, n) for f, n in zip(ladder, split, strict=True))
                    out.append(Candidate(family, Schedule.of(stages), cost))
    return out


# -- predicted loss and choice --------------------------------------------------------------------


def _signal_share(sigma: float) -> float:
    return (1 - sigma) ** 2 / ((1 - sigma) ** 2 + sigma**2)


# Transition rows of a candidate: (kappa, octaves_t of A, of B, octaves_s of A, of B, g_A - g_B).
_MAX_TRANSITIONS = 3


def _terms(candidate: Candidate, latent, base_sigmas: np.ndarray) -> np.ndarray:
    """(_MAX_TRANSITIONS, 6) transition rows of a candidate (zero rows pad)."""
    full = math.prod(latent)
    rows = np.zeros((_MAX_TRANSITIONS, 6), np.float64)
    step = 0
    stages = candidate.schedule.stages
    if len(stages) - 1 > _MAX_TRANSITIONS:
        raise ValueError(f"at most {_MAX_TRANSITIONS + 1} stages, got {len(stages)}")
    for i, (prev, nxt) in enumerate(itertools.pairwise(stages)):
        step += prev.steps
        shape_prev = reduced_shape(latent, prev.factors)
        shape_next = reduced_shape(latent, nxt.factors)
        sigma = shift_sigmas(base_sigmas[step], math.sqrt(math.prod(shape_next) / full))
        rows[i] = (
            _signal_share(float(sigma)),
            math.log2(prev.t_factor),
            math.log2(nxt.t_factor),
            math.log2(prev.s_factor),
            math.log2(nxt.s_factor),
            (math.prod(shape_next) - math.prod(shape_prev)) / full,
        )
    return rows


def _losses(terms: np.ndarray, signals: tuple[float, float], policy: Policy) -> np.ndarray:
    """Predicted loss (n,) of candidates with transition rows (n, _MAX_TRANSITIONS, 6)."""
    m, d = (min(max(float(v), 0.0), 1.0) for v in signals)
    kappa, ta, tb, sa, sb, drop = np.moveaxis(terms, -1, 0)

    def lost(x, octaves):  # share a grid `octaves` halvings coarser cannot represent
        return 1.0 - (1.0 - x) ** octaves

    per = (
        policy.motion_weight * (lost(m, ta) - lost(m, tb))
        + policy.detail_weight * (lost(d, sa) - lost(d, sb))
        + policy.base_weight * drop
    )
    return (kappa * per).sum(axis=-1)


def choose(
    candidates_: Sequence[Candidate],
    signals: tuple[float, float] | None,
    latent: tuple[int, int, int],
    base_sigmas,
    *,
    policy: Policy = DEFAULT_POLICY,
) -> Choice:
    """The candidate with the smallest predicted loss (cheapest on ties).

    Args:
      candidates_: from `candidates` (non-empty).
      signals: the probe's (motion, detail), or None for `policy.default_signals`.
      latent: full (t, h, w).
      base_sigmas: (N+1,) the base solver's sigmas.
      policy: weights and tolerance.
    """
    if not candidates_:
        raise ValueError("no candidate schedule fits the budget")
    sigmas = np.asarray(base_sigmas, np.float64)
    terms = np.stack([_terms(c, latent, sigmas) for c in candidates_])
    costs = np.asarray([c.cost for c in candidates_], np.float64)
    return _pick(tuple(candidates_), terms, costs, signals, policy)


def select(
    latent: tuple[int, int, int],
    patch: tuple[int, int, int],
    base_sigmas,
    budget: float,
    signals: tuple[float, float] | None,
    *,
    policy: Policy = DEFAULT_POLICY,
    families: Sequence[str] = FAMILIES,
    probe: Stage | None = None,
) -> Choice | None:
    """`choose` over `candidates` (token-step budget, `probe` as there), with the candidate
    table cached per (latent, steps, budget, policy, probe): a per-video decision costs a few
    vectorised NumPy operations.

    Returns None when no candidate fits the budget.
    """
    sigmas = tuple(float(v) for v in np.asarray(base_sigmas, np.float64))
    found, terms, costs = _table(
        tuple(latent), tuple(patch), sigmas, float(budget), policy, tuple(families), probe
    )
    if not found:
        return None
    return _pick(found, terms, costs, signals, policy)


def settled(
    latent: tuple[int, int, int],
    patch: tuple[int, int, int],
    base_sigmas,
    budget: float,
    *,
    policy: Policy = DEFAULT_POLICY,
    families: Sequence[str] = FAMILIES,
) -> Choice | None:
    """The choice when the content cannot change it, else None.

    Without a probe (whose cost could itself be spent on the schedule), the candidates that fit
    `budget` (or, below every one, the cheapest) are ranked for signals on an 11 x 11 grid
    over [0, 1]^2; when one schedule wins everywhere, e.g. because the budget affords only one,
    measuring the video would change nothing, and the probe's steps are saved.
    """
    sigmas = tuple(float(v) for v in np.asarray(base_sigmas, np.float64))
    return _settled(tuple(latent), tuple(patch), sigmas, float(budget), policy, tuple(families))


# Cached: the 121 rankings take ~10 ms of host time per call, as long as a whole `tiny` video
# on an accelerator, and a run asks the same question for every video.
@functools.lru_cache(maxsize=64)
def _settled(latent, patch, sigmas, budget, policy, families) -> Choice | None:
    table = functools.partial(_table, latent, patch, sigmas)
    found, terms, costs = table(budget, policy, families, None)
    if not found:
        lowest = cheapest(latent, patch, sigmas, policy=policy, families=families)
        if lowest is None:
            return None
        found, terms, costs = table(lowest, policy, families, None)
    grid = np.linspace(0.0, 1.0, 11)
    first = _pick(found, terms, costs, (0.0, 0.0), policy)
    for m, d in itertools.product(grid, grid):
        if _pick(found, terms, costs, (float(m), float(d)), policy).schedule != first.schedule:
            return None
    return dataclasses.replace(first, signals=None)


def cheapest(
    latent: tuple[int, int, int],
    patch: tuple[int, int, int],
    base_sigmas,
    *,
    policy: Policy = DEFAULT_POLICY,
    families: Sequence[str] = FAMILIES,
    probe: Stage | None = None,
) -> float | None:
    """The smallest relative cost of any candidate of `families` (None when there is none)."""
    sigmas = tuple(float(v) for v in np.asarray(base_sigmas, np.float64))
    _, _, costs = _table(tuple(latent), tuple(patch), sigmas, 1.0, policy, tuple(families), probe)
    return float(costs.min()) if costs.size else None


@functools.lru_cache(maxsize=64)
def _table(latent, patch, sigmas, budget, policy, families, probe):
    found = tuple(
        candidates(
            latent,
            patch,
            len(sigmas) - 1,
            budget,
            policy=policy,
            families=families,
            probe=probe,
        )
    )
    base = np.asarray(sigmas, np.float64)
    terms = np.asarray([_terms(c, latent, base) for c in found], np.float64)
    costs = np.asarray([c.cost for c in found], np.float64)
    return found, terms.reshape(-1, _MAX_TRANSITIONS, 6), costs


def _pick(found, terms, costs, signals, policy) -> Choice:
    m, d = policy.default_signals if signals is None else signals
    loss = _losses(terms, (m, d), policy)
    # smallest loss (to 1e-12), then cheapest, then first enumerated
    order = np.lexsort((np.arange(len(found)), costs, np.round(loss, 12)))
    i = int(order[0])
    c, best = found[i], float(loss[i])
    measured = None if signals is None else (float(m), float(d))
    if best > policy.tolerance and c.family != "none":
        n = c.schedule.num_steps
        return Choice("none", Schedule.full(n), 1.0, 0.0, measured)
    return Choice(c.family, c.schedule, c.cost, best, measured)
