"""AdamW with linear warm-up and cosine decay, and an exponential moving average of weights."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimiser settings.

    Attributes:
        lr: peak learning rate, reached after `warmup` steps.
        warmup: linear warm-up steps from 0.
        decay_steps: steps of the cosine decay after the warm-up (0: constant after warm-up).
        min_lr_ratio: final learning rate of the cosine as a fraction of `lr`.
        b1, b2, eps: Adam moments.
        weight_decay: decoupled weight decay (AdamW), applied to every parameter of rank >= 2.
        grad_clip: global-norm clipping threshold (0 disables it).
        ema_decay: decay of the weight EMA; the effective decay warms up as
            min(ema_decay, (1 + t) / (10 + t)) so early averages are not dominated by the
            random initialisation.
    """

    lr: float = 1e-3
    warmup: int = 100
    decay_steps: int = 0
    min_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ema_decay: float = 0.999

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.warmup < 0 or self.decay_steps < 0:
            raise ValueError(
                f"warmup and decay_steps must be >= 0, got {self.warmup}, {self.decay_steps}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0):
            raise ValueError(f"Adam betas must be in [0, 1), got {self.b1}, {self.b2}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("weight_decay and grad_clip must be >= 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")


def learning_rate(config: OptimConfig) -> optax.Schedule:
    """Linear warm-up to `lr`, then cosine decay to `min_lr_ratio * lr` (or constant)."""
    warm = optax.linear_schedule(0.0, config.lr, max(config.warmup, 1))
    if config.decay_steps == 0:
        after = optax.constant_schedule(config.lr)
    else:
        after = optax.cosine_decay_schedule(config.lr, config.decay_steps, config.min_lr_ratio)
    return optax.join_schedules([warm, after], [config.warmup])


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the `learning_rate` schedule."""
    # Decaying norms' scales and biases (rank < 2) only pulls them away from their identity.
    mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    adamw = optax.adamw(
        learning_rate(config),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=mask,
    )
    if config.grad_clip:
        adamw = optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw)
    return _standard_promotion(adamw)


def _standard_promotion(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` traced under standard dtype promotion.

    optax's Adam bias correction computes `beta ** count` (a Python float to an int32
    power), which `jax_numpy_dtype_promotion="strict"` (vidax's test setting) rejects.
    """

    def init(params):
        with jax.numpy_dtype_promotion("standard"):
            return inner.init(params)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):
            return inner.update(updates, state, params)

    return optax.GradientTransformation(init, update)


def ema_decay_at(step: jax.Array, decay: float) -> jax.Array:
    """The EMA decay used at (0-based) update `step`: min(decay, (1 + t) / (10 + t))."""
    t = step.astype(jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + t) / (10.0 + t))


def ema_update(ema, params, step: jax.Array, decay: float):
    """ema <- d * ema + (1 - d) * params with the warmed-up decay d of `ema_decay_at`."""
    d = ema_decay_at(step, decay)
    return jax.tree.map(lambda e, p: (d * e + (1.0 - d) * p).astype(e.dtype), ema, params)
