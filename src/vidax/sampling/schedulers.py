"""Flow-matching solvers as pure functions of a traced step index.

Rectified flow: x_σ = (1 − σ)·x₀ + σ·ε, and the model predicts the velocity v = ε − x₀, so a
solver walks x from σ₀ ≈ 1 (noise) down to σ_N = 0 (data).

Every solver shares one protocol (`Solver`):

- `sigmas`: (N+1,) float32, descending, ending at the final noise level (0 by default).
- `timesteps`: (N,) float32, what the model is fed at step i (`timesteps[i]`).
- `init(x) -> state`: a pytree of fixed-shape arrays (usable as a `lax.fori_loop` carry).
- `step(state, i, x, v) -> (x_next, state)`: advances x from `sigmas[i]` to `sigmas[i+1]` given
  the model's velocity v at `timesteps[i]`; i may be a traced int32.

Schedules and every solver coefficient are computed on the host in NumPy when the solver is
built, so `step` only gathers constants by index: no Python control flow depends on i.

**State and restarts.** A solver's state is the history a multistep method carries between
steps (for UniPC: the last x₀ predictions and the sample before the last predictor). `init(x)`
is a *fresh* state: `step(init(x), k, x, v)` starts at any step k as if the schedule began there,
so a multistep solver warms up again at first order (diffusers' `set_begin_index(k)` after
`set_timesteps`). Carrying the state returned by step k−1 instead continues the same
trajectory. Euler has no state (an empty tuple).

Both solvers match diffusers (`FlowMatchEulerDiscreteScheduler`, `UniPCMultistepScheduler` with
flow sigmas) to float32 rounding: the schedules bit for bit, and the solver coefficients with the
same float32 arithmetic, in the same order, as the reference.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

# Flow-matching models are trained on t = 1000·σ.
NUM_TRAIN_TIMESTEPS = 1000


class Solver(Protocol):
    """What `vidax.sampling.sample` needs from a solver (see the module docstring)."""

    @property
    def num_steps(self) -> int: ...

    @property
    def sigmas(self) -> np.ndarray: ...

    @property
    def timesteps(self) -> np.ndarray: ...

    def init(self, x: jax.Array) -> Any: ...

    def step(self, state: Any, i, x: jax.Array, v: jax.Array) -> tuple[jax.Array, Any]: ...


def shift_sigmas(sigmas, shift: float):
    """Time-shifts noise levels toward the noisy end: σ' = s·σ / (1 + (s − 1)·σ).

    Works on floats, NumPy and JAX arrays alike (σ = 0 and σ = 1 are fixed points).

    Args:
      sigmas: noise levels in [0, 1], any shape.
      shift: s > 0; s > 1 spends more steps at high noise (Wan: 3 at 480p, 5 at 720p).

    Returns:
      The shifted noise levels, same shape and type.
    """
    if isinstance(shift, (int, float)) and not (shift > 0 and math.isfinite(shift)):
        raise ValueError(f"shift must be a finite number > 0, got {shift}")
    return shift * sigmas / (1 + (shift - 1) * sigmas)


# -- shared validation ----------------------------------------------------------------------------


def _check_common(name: str, num_steps, shift, schedule) -> None:
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)):
        raise ValueError(f"{name}: num_steps must be an int, got {num_steps!r}")
    if num_steps < 1:
        raise ValueError(f"{name}: num_steps must be >= 1, got {num_steps}")
    if not isinstance(shift, (int, float)) or not (shift > 0 and math.isfinite(shift)):
        raise ValueError(f"{name}: shift must be a finite number > 0, got {shift!r}")
    if schedule is None:
        return
    if shift != 1.0:
        raise ValueError(
            f"{name}: an explicit schedule is used as given; shift it first "
            "(shift_sigmas) instead of passing shift"
        )
    s = np.asarray(schedule, np.float64)
    if s.shape != (num_steps + 1,):
        raise ValueError(
            f"{name}: the schedule must have num_steps + 1 = {num_steps + 1} entries, "
            f"got shape {s.shape}"
        )
    if not np.all(np.isfinite(s)) or s[0] > 1.0 or s[-1] < 0.0:
        raise ValueError(f"{name}: sigmas must lie in [0, 1], got {s.tolist()}")
    if not np.all(np.diff(s) < 0):
        raise ValueError(f"{name}: sigmas must be strictly descending, got {s.tolist()}")


def _schedule_tuple(sigmas) -> tuple[float, ...]:
    s = np.asarray(sigmas, np.float64)
    if s.ndim != 1 or s.size < 2:
        raise ValueError(f"sigmas must be a 1-D array of at least 2 entries, got shape {s.shape}")
    return tuple(float(v) for v in s)


def _frozen(a: np.ndarray) -> np.ndarray:
    # The arrays are cached on a hashable solver; a caller mutating them would corrupt it.
    a.flags.writeable = False
    return a


def _compute_dtype(x: jax.Array):
    # Low-precision latents are stepped in float32 (as the reference upcasts), float64 stays.
    return x.dtype if jnp.finfo(x.dtype).bits >= 32 else jnp.dtype(jnp.float32)


# -- Euler ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowEuler:
    """First-order Euler on the flow ODE: x ← x + (σ_{i+1} − σ_i)·v.

    Equals diffusers' `FlowMatchEulerDiscreteScheduler(shift=shift)` (default config). Note that
    diffusers shifts the smallest training sigma once at construction and the whole linspace again
    in `set_timesteps`; the schedule here reproduces that exactly.

    Attributes:
      num_steps: N denoising steps (model evaluations).
      shift: time shift s applied to the linear schedule (`shift_sigmas`).
      schedule: explicit (N+1,) descending sigmas used as given (see `from_sigmas`); shift
        must then be 1.
      linspace_sigmas: σ = shift(linspace(1, 0, N+1)[:−1]), then 0: the schedule the
        HunyuanVideo (1 and 1.5) pipelines pass to the scheduler instead of its own spacing of
        1000·[1, σ_min] (the two differ from the second step on).
    """

    num_steps: int
    shift: float = 1.0
    schedule: tuple[float, ...] | None = None
    linspace_sigmas: bool = False

    def __post_init__(self):
        _check_common("FlowEuler", self.num_steps, self.shift, self.schedule)
        if self.linspace_sigmas and self.schedule is not None:
            raise ValueError("FlowEuler: pass an explicit schedule or linspace_sigmas, not both")

    @classmethod
    def from_sigmas(cls, sigmas) -> FlowEuler:
        """An Euler solver over an explicit descending schedule (N+1,), last entry usually 0.

        Timesteps are 1000·σ, as diffusers derives them from custom sigmas.
        """
        schedule = _schedule_tuple(sigmas)
        return cls(num_steps=len(schedule) - 1, schedule=schedule)

    @functools.cached_property
    def sigmas(self) -> np.ndarray:
        """(N+1,) float32 noise levels, descending."""
        if self.schedule is not None:
            return _frozen(np.asarray(self.schedule, np.float32))
        if self.linspace_sigmas:
            # As diffusers' set_timesteps(sigmas=...): float32 sigmas shifted in float32.
            base = np.linspace(1.0, 0.0, self.num_steps + 1)[:-1].astype(np.float32)
            s32, s32_minus_1 = np.float32(self.shift), np.float32(self.shift - 1)
            sigmas = s32 * base / (np.float32(1) + s32_minus_1 * base)
            return _frozen(np.append(sigmas, np.float32(0)))
        # The scheduler's __init__ shifts its float32 training sigmas (1..1/1000) once ...
        sigma_min = np.float32(1.0) / np.float32(NUM_TRAIN_TIMESTEPS)
        # (torch rounds the Python scalars `shift` and `shift - 1` to float32 separately.)
        s32, s32_minus_1 = np.float32(self.shift), np.float32(self.shift - 1)
        sigma_min = s32 * sigma_min / (np.float32(1) + s32_minus_1 * sigma_min)
        # ... then set_timesteps spaces 1000·[σ_max, σ_min] linearly in float64 and shifts again.
        t = np.linspace(
            1.0 * NUM_TRAIN_TIMESTEPS, float(sigma_min) * NUM_TRAIN_TIMESTEPS, self.num_steps
        )
        sigmas = shift_sigmas(t / NUM_TRAIN_TIMESTEPS, self.shift).astype(np.float32)
        return _frozen(np.append(sigmas, np.float32(0)))

    @functools.cached_property
    def timesteps(self) -> np.ndarray:
        """(N,) float32 model timesteps 1000·σ_i."""
        return _frozen(self.sigmas[:-1] * np.float32(NUM_TRAIN_TIMESTEPS))

    @functools.cached_property
    def _dt(self) -> np.ndarray:
        return _frozen(self.sigmas[1:] - self.sigmas[:-1])

    def init(self, x: jax.Array) -> tuple[()]:
        """Euler carries no state."""
        del x
        return ()

    def step(self, state, i, x: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[()]]:
        """x at σ_{i+1} from x at σ_i and the velocity v there (computed in float32 or wider).

        Args:
          state: `init`'s empty tuple.
          i: step index in [0, N), int or traced int32.
          x, v: (b, t, h, w, c) (any shape) latent and velocity.

        Returns:
          (x_next in x's dtype, state).
        """
        dtype = _compute_dtype(x)
        dt = jnp.asarray(self._dt)[i].astype(dtype)
        x_next = x.astype(dtype) + dt * v.astype(dtype)
        return x_next.astype(x.dtype), state


# -- UniPC ----------------------------------------------------------------------------------------


class UniPCState(NamedTuple):
    """UniPC's carry between steps.

    Attributes:
      history: (order, *x.shape) float32 x₀ predictions, oldest first (only the last `filled`
        are valid).
      last_sample: the sample the previous predictor started from (the corrector re-solves that
        step with the new prediction).
      filled: int32 scalar, valid history entries (0 in a fresh state: no corrector, first
        order). Not `count`: a NamedTuple field of that name hides `tuple.count`.
    """

    history: jax.Array
    last_sample: jax.Array
    filled: jax.Array


class _Coefficients(NamedTuple):
    """One UniP or UniC update x_t = a·x − c_m·m₀ − c_b·(Σ_k ρ_k·(m_k − m₀)/r_k [+ ρ_t·(m_t − m₀)])
    for every (step, order): scalars (N, order), per history item (N, order, order − 1)."""

    a: np.ndarray
    c_m: np.ndarray
    c_b: np.ndarray
    r: np.ndarray
    rho: np.ndarray
    rho_t: np.ndarray


def _lambda(sigma: np.float32) -> np.float32:
    """log(α/σ) with α = 1 − σ, in float32 like the reference (−∞ at σ=1, +∞ at σ=0)."""
    alpha = np.float32(1) - sigma
    with np.errstate(divide="ignore"):
        # log in float64, rounded once: the correctly rounded float32 log.
        return np.float32(np.log(np.float64(alpha))) - np.float32(np.log(np.float64(sigma)))


def _unipc_update(
    sigmas: np.ndarray,
    t: int,
    s0: int,
    history: list[int],
    order: int,
    solver_type: str,
    *,
    corrector: bool,
) -> tuple[np.float32, np.float32, np.float32, list, list, np.float32]:
    """Coefficients of diffusers' `multistep_uni_{p,c}_bh_update` (predict_x0, flow sigmas).

    Mirrors the reference's float32 arithmetic op by op (the small linear solves run in float64 and
    are rounded once). `t`/`s0` index the target and current sigma, `history` the sigmas of the
    older x₀ predictions (newest first), `order` is the update's order p.
    """
    f32 = np.float32
    sigma_t, sigma_s0 = sigmas[t], sigmas[s0]
    alpha_t = f32(1) - sigma_t
    lambda_t, lambda_s0 = _lambda(sigma_t), _lambda(sigma_s0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        h = lambda_t - lambda_s0
        rks = [(_lambda(sigmas[si]) - lambda_s0) / h for si in history] + [f32(1)]
        hh = -h
        h_phi_1 = f32(np.expm1(np.float64(hh)))
        h_phi_k = h_phi_1 / hh - f32(1)
        b_h = hh if solver_type == "bh1" else f32(np.expm1(np.float64(hh)))
        factorial = 1
        b, rows = [], []
        for k in range(1, order + 1):
            rows.append([np.power(r, f32(k - 1)) for r in rks])
            b.append(h_phi_k * f32(factorial) / b_h)
            factorial *= k + 1
            h_phi_k = h_phi_k / hh - f32(1) / f32(factorial)
        a = sigma_t / sigma_s0
        c_m = alpha_t * h_phi_1
        c_b = alpha_t * b_h
    matrix = np.asarray(rows, np.float64)
    rhs = np.asarray(b, np.float64)
    if corrector:
        rhos = [0.5] if order == 1 else np.linalg.solve(matrix, rhs).tolist()
        rho, rho_t = rhos[:-1], f32(rhos[-1])
    else:
        if order == 1:
            rho = []
        elif order == 2:
            rho = [0.5]
        else:
            rho = np.linalg.solve(matrix[:-1, :-1], rhs[:-1]).tolist()
        rho_t = f32(0)
    return f32(a), f32(c_m), f32(c_b), [f32(r) for r in rks[:-1]], [f32(p) for p in rho], rho_t


@dataclasses.dataclass(frozen=True, kw_only=True)
class UniPC:
    """UniPC multistep predictor-corrector (B(h) variants, x₀ prediction) on flow sigmas.

    Equals diffusers' `UniPCMultistepScheduler(prediction_type="flow_prediction",
    use_flow_sigmas=True, flow_shift=shift, solver_order=order, solver_type=solver_type,
    lower_order_final=lower_order_final)` with its other defaults (predict_x0, corrector on every
    step). Schedule: σ = shift(linspace(1, 1/1000, N+1)[:−1]) with σ₀ lowered by 1e-6 (λ = log(α/σ)
    is −∞ at σ = 1), then 0; timesteps are ⌊1000·σ⌋.

    Each step i: (1) x₀ prediction m_i = x − σ_i·v; (2) UniC corrects x with m_i, re-solving the
    previous step from `last_sample`; (3) UniP of order min(order, steps so far [, N − i]) moves the
    corrected x to σ_{i+1}.

    Attributes:
      num_steps: N denoising steps (model evaluations).
      shift: flow shift s (`shift_sigmas`).
      order: predictor order, 1-3 (the corrector adds one).
      solver_type: "bh2" (default; recommended for guided sampling) or "bh1".
      lower_order_final: drop to lower orders on the last steps; required when the final sigma is
        0 and order > 1 (the reference produces inf there otherwise).
      schedule: explicit (N+1,) descending sigmas (see `from_sigmas`); shift must then be 1.
    """

    num_steps: int
    shift: float = 1.0
    order: int = 2
    solver_type: str = "bh2"
    lower_order_final: bool = True
    schedule: tuple[float, ...] | None = None

    def __post_init__(self):
        _check_common("UniPC", self.num_steps, self.shift, self.schedule)
        if isinstance(self.order, bool) or self.order not in (1, 2, 3):
            raise ValueError(f"UniPC: order must be 1, 2 or 3, got {self.order!r}")
        if self.solver_type not in ("bh1", "bh2"):
            raise ValueError(f"UniPC: solver_type must be 'bh1' or 'bh2', got {self.solver_type!r}")
        if not isinstance(self.lower_order_final, bool):
            raise ValueError(
                f"UniPC: lower_order_final must be a bool, got {self.lower_order_final!r}"
            )
        if not self.lower_order_final and self.order > 1 and self.sigmas[-1] == 0:
            raise ValueError(
                "UniPC: lower_order_final=False with order > 1 divides by an infinite step onto "
                "sigma=0 on the last step; keep lower_order_final=True or end the schedule above 0"
            )

    @classmethod
    def from_sigmas(
        cls, sigmas, *, order: int = 2, solver_type: str = "bh2", lower_order_final: bool = True
    ) -> UniPC:
        """A UniPC solver over an explicit descending schedule (N+1,), last entry usually 0.

        As diffusers does for custom sigmas, a first sigma within 1e-6 of 1 is lowered by 1e-6,
        and timesteps are ⌊1000·σ⌋.
        """
        schedule = _schedule_tuple(sigmas)
        return cls(
            num_steps=len(schedule) - 1,
            order=order,
            solver_type=solver_type,
            lower_order_final=lower_order_final,
            schedule=schedule,
        )

    @functools.cached_property
    def _sigmas64(self) -> np.ndarray:
        # float64 before the final cast, as the reference (timesteps are taken from these).
        if self.schedule is None:
            s = np.linspace(1.0, 1.0 / NUM_TRAIN_TIMESTEPS, self.num_steps + 1)[:-1]
            s = np.append(shift_sigmas(s, self.shift), 0.0)
        else:
            s = np.array(self.schedule, np.float64)
        if abs(s[0] - 1.0) < 1e-6:
            s[0] -= 1e-6
        return s

    @functools.cached_property
    def sigmas(self) -> np.ndarray:
        """(N+1,) float32 noise levels, descending."""
        return _frozen(self._sigmas64.astype(np.float32))

    @functools.cached_property
    def timesteps(self) -> np.ndarray:
        """(N,) float32 integer-valued model timesteps ⌊1000·σ_i⌋."""
        t = (self._sigmas64[:-1] * NUM_TRAIN_TIMESTEPS).astype(np.int64)
        return _frozen(t.astype(np.float32))

    def _order_cap(self, i: int) -> int:
        return min(self.order, self.num_steps - i) if self.lower_order_final else self.order

    @functools.cached_property
    def _order_caps(self) -> np.ndarray:
        return _frozen(np.array([self._order_cap(i) for i in range(self.num_steps)], np.int32))

    def _tables(self, corrector: bool) -> _Coefficients:
        n, order, sigmas = self.num_steps, self.order, self.sigmas
        a = np.ones((n, order), np.float32)
        c_m = np.zeros((n, order), np.float32)
        c_b = np.zeros((n, order), np.float32)
        r = np.ones((n, order, order - 1), np.float32)
        rho = np.zeros((n, order, order - 1), np.float32)
        rho_t = np.zeros((n, order), np.float32)
        for i in range(n):
            for p in range(1, order + 1):
                if corrector:
                    # Re-solves step i−1 (σ_{i−1} → σ_i) with the order that step's predictor used.
                    if i == 0 or p > min(self._order_cap(i - 1), i):
                        continue
                    t, s0, hist = i, i - 1, [i - 1 - k for k in range(1, p)]
                else:
                    if p > min(self._order_cap(i), i + 1):
                        continue
                    t, s0, hist = i + 1, i, [i - k for k in range(1, p)]
                coef = _unipc_update(sigmas, t, s0, hist, p, self.solver_type, corrector=corrector)
                a[i, p - 1], c_m[i, p - 1], c_b[i, p - 1] = coef[:3]
                if p == 1 and not corrector:
                    # First order has no correction term; its factor B(h) is infinite on a step
                    # onto σ = 0 with bh1, where the reference computes −∞·0 = NaN.
                    c_b[i, p - 1] = 0
                r[i, p - 1, : p - 1] = coef[3]
                rho[i, p - 1, : len(coef[4])] = coef[4]
                rho_t[i, p - 1] = coef[5]
        return _Coefficients(*(_frozen(x) for x in (a, c_m, c_b, r, rho, rho_t)))

    @functools.cached_property
    def _predictor(self) -> _Coefficients:
        return self._tables(corrector=False)

    @functools.cached_property
    def _corrector(self) -> _Coefficients:
        return self._tables(corrector=True)

    def init(self, x: jax.Array) -> UniPCState:
        """A fresh state for a trajectory starting at x (any step; see the module docstring)."""
        dtype = _compute_dtype(x)
        return UniPCState(
            history=jnp.zeros((self.order, *x.shape), dtype),
            last_sample=jnp.zeros(x.shape, dtype),
            filled=jnp.zeros((), jnp.int32),
        )

    def step(
        self, state: UniPCState, i, x: jax.Array, v: jax.Array
    ) -> tuple[jax.Array, UniPCState]:
        """Corrects x with the new prediction, then predicts x at σ_{i+1}.

        Args:
          state: from `init` (fresh start at step i) or from the step i − 1.
          i: step index in [0, N), int or traced int32.
          x, v: (b, t, h, w, c) (any shape) latent at σ_i and the model's velocity there.

        Returns:
          (x_next in x's dtype, state).
        """
        dtype = _compute_dtype(x)
        x_in, v = x.astype(dtype), v.astype(dtype)
        sigma = jnp.asarray(self.sigmas)[i].astype(dtype)
        m_t = x_in - sigma * v  # x₀ prediction at the uncorrected sample, as the reference

        # UniC: re-solve the previous step with m_t, using the order its predictor used.
        p_c = jnp.minimum(jnp.asarray(self._order_caps)[jnp.maximum(i - 1, 0)], state.filled)
        corrected = self._update(
            self._corrector, i, jnp.maximum(p_c, 1) - 1, state.last_sample, state.history, m_t
        )
        x_c = jnp.where(state.filled > 0, corrected, x_in)

        history = jnp.concatenate([state.history[1:], m_t[None]], axis=0)
        filled = jnp.minimum(state.filled + 1, self.order)
        p = jnp.minimum(jnp.asarray(self._order_caps)[i], filled)
        x_next = self._update(self._predictor, i, p - 1, x_c, history, None)
        state = UniPCState(history=history, last_sample=x_c, filled=filled.astype(jnp.int32))
        return x_next.astype(x.dtype), state

    def _update(self, coef: _Coefficients, i, p, x, history, m_t):
        """x_t = a·x − c_m·m₀ − c_b·(Σ_k ρ_k·D_k [+ ρ_t·(m_t − m₀)]) for order index p."""
        dtype = x.dtype

        def pick(table):
            return jnp.asarray(table)[i, p].astype(dtype)

        m0 = history[-1]
        x_t = pick(coef.a) * x - pick(coef.c_m) * m0
        res = None
        for k in range(self.order - 1):
            # Unused orders have ρ = 0 and r = 1, so they add exactly zero.
            d = (history[-(k + 2)] - m0) / pick(coef.r[..., k])
            term = pick(coef.rho[..., k]) * d
            res = term if res is None else res + term
        if m_t is not None:
            term = pick(coef.rho_t) * (m_t - m0)
            res = term if res is None else res + term
        if res is None:
            return x_t
        return x_t - pick(coef.c_b) * res


# -- registry -------------------------------------------------------------------------------------

SOLVERS: dict[str, type] = {"euler": FlowEuler, "unipc": UniPC}


def make_solver(name: str, num_steps: int, shift: float = 1.0, **options) -> Solver:
    """The solver registered as `name` ("euler" or "unipc") with N steps and a time shift.

    Args:
      name: key of `SOLVERS`.
      num_steps: N denoising steps.
      shift: time shift s of the schedule.
      **options: solver-specific fields (e.g. UniPC `order`).
    """
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; known: {sorted(SOLVERS)}")
    return SOLVERS[name](num_steps=num_steps, shift=shift, **options)
