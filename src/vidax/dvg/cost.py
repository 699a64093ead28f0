"""Analytic FLOPs of one DiT forward, and the relative cost of a stage schedule.

The selector compares schedules by the matmul FLOPs they spend (dense layers and attention; the
element-wise work is a few percent and scales the same way). Counting from the config is exact
for the dots and instant, so the selector never compiles anything to price a candidate;
`benchmarks/dvg.py` checks the totals against the compiled step's HLO (`vidax.planner.hlo`).
"""

from __future__ import annotations

import math

from vidax.dvg.schedule import Schedule, reduced_shape


def step_flops(config, latent: tuple[int, int, int], *, batch: int = 1) -> float:
    """Matmul FLOPs of one forward of a DiT on a (t, h, w) latent (2 per multiply-add).

    Args:
      config: a `WanConfig`, `HunyuanVideoConfig` or `HunyuanVideo15Config` (any config with
        `dim`, `num_layers`, `patch_size` and `text_len` falls back to the Wan block layout).
      latent: (t, h, w) latent size (divisible by the patch).
      batch: forwards per step (2 with batched classifier-free guidance).
    """
    pt, ph, pw = config.patch_size
    t, h, w = latent
    n = math.ceil(t / pt) * math.ceil(h / ph) * math.ceil(w / pw)
    s = config.text_len
    d = config.dim
    patch_in = pt * ph * pw * config.in_channels
    patch_out = pt * ph * pw * config.out_channels
    io = 2 * n * d * (patch_in + patch_out)
    if hasattr(config, "num_refiner_layers"):  # HunyuanVideo's text refiner (token-independent)
        r = config.refiner_mlp_dim
        refiner = 2 * s * config.text_dim * d + config.num_refiner_layers * (
            2 * s * 4 * d * d + 4 * s * s * d + 4 * s * d * r
        )
        io += refiner
    else:  # Wan's text embedder MLP
        io += 2 * s * (config.text_dim * d + d * d)
    if hasattr(config, "num_single_layers"):
        f = config.mlp_dim
        joint = n + s
        # dual-stream block: separate video/text projections, joint attention.
        dual = 2 * (n + s) * (4 * d * d + 2 * d * f) + 4 * joint * joint * d
        # single-stream block: fused qkv + MLP in, [attn; MLP] out, over the joint sequence.
        single = 2 * joint * (3 * d * d + d * f + (d + f) * d) + 4 * joint * joint * d
        total = config.num_layers * dual + config.num_single_layers * single + io
    elif hasattr(config, "mlp_dim"):  # HunyuanVideo 1.5: dual-stream blocks only
        f = config.mlp_dim
        joint = n + s
        dual = 2 * (n + s) * (4 * d * d + 2 * d * f) + 4 * joint * joint * d
        total = config.num_layers * dual + io
    else:  # Wan: self-attention, cross-attention to text, FFN
        f = config.ffn_dim
        block = (
            2 * n * d * d * 4  # self-attention q, k, v, out
            + 4 * n * n * d  # scores and values
            + 2 * n * d * d * 2  # cross-attention q, out
            + 2 * s * d * d * 2  # cross-attention k, v on the text
            + 4 * n * s * d  # cross-attention scores and values
            + 4 * n * d * f  # FFN
        )
        total = config.num_layers * block + io
    return float(batch * total)


def schedule_flops(
    schedule: Schedule, config, latent: tuple[int, int, int], *, batch: int = 1
) -> float:
    """Total matmul FLOPs of a schedule's model evaluations (padding ignored)."""
    return sum(
        stage.steps * step_flops(config, reduced_shape(latent, stage.factors), batch=batch)
        for stage in schedule.stages
    )


def relative_cost(schedule: Schedule, config, latent: tuple[int, int, int]) -> float:
    """A schedule's FLOPs as a fraction of the full-resolution sampler with the same steps."""
    return schedule_flops(schedule, config, latent) / (
        schedule.num_steps * step_flops(config, latent)
    )
