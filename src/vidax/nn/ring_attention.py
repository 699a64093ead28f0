"""Attention under an active mesh: ring attention and the TPU splash kernel, via `shard_map`.

Both read the mesh and the layout of q/k/v from the active `vidax.sharding.use_mesh` strategy
(q: `("batch", "attn_tokens", "attn_heads", "head_dim")`; k/v: `"kv_tokens"` for
self-attention, `"text_tokens"` otherwise) and run one program per device.

Ring attention (`ring_attention`): queries and keys/values are split over the `seq` axis.
Each device attends its query shard to the key/value shard it holds, then passes that shard to
its ring successor with a collective-permute (`jax.lax.ppermute`); after `seq` steps every
query has seen every key. Partial results merge exactly through their log-sum-exp. The permute
for the next step is issued before the current block is computed, so XLA can overlap them.
Tokens that do not divide by `seq` are padded and the padded keys masked.

On TPU meshes the per-device block is jax's Pallas splash-attention kernel (`splash_attention`
uses it alone for the non-ring layouts); elsewhere it is the online-softmax jnp block of
`vidax.nn.softmax.attend_blocks`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from vidax.nn.softmax import attend_blocks, merge_partials
from vidax.sharding.rules import current, logical_to_spec

Q_AXES = ("batch", "attn_tokens", "attn_heads", "head_dim")
# Splash tiles: sequence lengths are padded to a multiple of LANE (of the largest block when
# longer than it), blocks are the largest of these dividing the padded length.
LANE = 128
_SPLASH_BLOCKS = (512, 256, 128)


def _active(what: str):
    active = current()
    if active is None:
        raise ValueError(f"{what} needs an active mesh: call it inside vidax.sharding.use_mesh")
    return active


def _specs(mesh, strategy, q_shape, k_shape, *, self_attention: bool):
    kv_axes = ("batch", "kv_tokens" if self_attention else "text_tokens", *Q_AXES[2:])
    # Specs for shard_map must divide exactly: callers pad tokens first.
    q_spec = logical_to_spec(Q_AXES, strategy.activations, mesh, q_shape)
    k_spec = logical_to_spec(kv_axes, strategy.activations, mesh, k_shape)
    return q_spec, k_spec


def ring_attention(q, k, v, *, scale: float, axis: str = "seq"):
    """Ring attention over mesh axis `axis` under the active strategy (see the module doc).

    Args:
        q: (b, l, n, k) queries; k, v: (b, s, n, k) keys/values with s == l (self-attention).
        scale: logit scale.
        axis: the ring's mesh axis.

    Returns:
        (b, l, n, k) attention output in q's dtype.
    """
    mesh, strategy = _active("ring attention")
    ring = mesh.shape.get(axis, 1)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"ring attention is self-attention: got q {q.shape}, k {k.shape}")
    length = q.shape[1]
    padded = -(-length // ring) * ring
    if padded != length:
        widths = ((0, 0), (0, padded - length), (0, 0), (0, 0))
        q, k, v = (jnp.pad(x, widths) for x in (q, k, v))
    # Whatever the strategy, the ring shards queries and keys over its axis.
    token_rules = (("attn_tokens", axis), ("kv_tokens", axis))
    others = tuple(r for r in strategy.activations if r[0] not in ("attn_tokens", "kv_tokens"))
    strategy = _with_rules(strategy, (*others, *token_rules))
    q_spec, k_spec = _specs(mesh, strategy, q.shape, k.shape, self_attention=True)
    if ring > 1 and (q_spec[1] != axis or k_spec[1] != axis):
        raise ValueError(f"ring attention could not shard tokens over {axis!r}: q {q_spec}")
    shard_len = padded // ring
    tpu = mesh.devices.flat[0].platform == "tpu"
    block = functools.partial(block_attention, scale=scale, tpu=tpu)

    def local(q, k, v):
        me = jax.lax.axis_index(axis) if ring > 1 else 0
        state = None
        for step in range(ring):
            # This device holds the keys of shard (me - step) mod ring.
            source = (me - step) % ring
            valid = jnp.clip(length - source * shard_len, 0, shard_len)
            if step + 1 < ring:  # start passing the shard on before computing with it
                perm = [(i, (i + 1) % ring) for i in range(ring)]
                k_next = jax.lax.ppermute(k, axis, perm)
                v_next = jax.lax.ppermute(v, axis, perm)
            part = block(q, k, v, valid)
            state = part if state is None else merge_partials(state, part)
            if step + 1 < ring:
                k, v = k_next, v_next
        assert state is not None  # ring >= 1 steps ran
        return state[0].astype(q.dtype)

    out = jax.shard_map(
        local, mesh=mesh, in_specs=(q_spec, k_spec, k_spec), out_specs=q_spec, check_vma=False
    )(q, k, v)
    out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, q_spec))
    return out[:, :length] if padded != length else out


def splash_attention(q, k, v, *, scale: float):
    """Splash attention per device, in the active strategy's q/k/v layout (TPU meshes), or on
    the one device when no mesh is active.

    Queries keep their token and head sharding; keys/values keep their head sharding and are
    gathered over tokens by GSPMD (each device's kernel needs all keys). Query tokens that do
    not divide by their shards are padded (and the padded rows dropped), so no device computes
    another device's rows.
    """
    active = current()
    if active is None:  # one device: the kernel over all of q, k, v
        return splash_block(q, k, v, k.shape[1], scale=scale, residuals=False)[0].astype(q.dtype)
    mesh, strategy = active
    length = q.shape[1]
    token_axes = logical_to_spec(Q_AXES, strategy.activations, mesh, q.shape, pad=("attn_tokens",))[
        1
    ]
    shards = _size(mesh, token_axes)
    padded = -(-length // shards) * shards
    if padded != length:
        q = jnp.pad(q, ((0, 0), (0, padded - length), (0, 0), (0, 0)))
    q_spec, k_spec = _specs(mesh, strategy, q.shape, k.shape, self_attention=length == k.shape[1])
    k_spec = P(k_spec[0], None, *k_spec[2:])
    s = k.shape[1]

    def local(q, k, v):
        out, _ = splash_block(q, k, v, s, scale=scale, residuals=False)
        return out.astype(q.dtype)

    out = jax.shard_map(
        local, mesh=mesh, in_specs=(q_spec, k_spec, k_spec), out_specs=q_spec, check_vma=False
    )(q, k, v)
    out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, q_spec))
    return out[:, :length] if padded != length else out


def _size(mesh, axes) -> int:
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    size = 1
    for a in axes:
        size *= mesh.shape[a]
    return size


def _with_rules(strategy, activations):
    return dataclasses.replace(strategy, activations=activations)


def block_attention(q, k, v, valid, *, scale: float, tpu: bool):
    """One device's attention of q over its k/v with the log-sum-exp, keys from `valid` on
    masked: `splash_block` on a TPU (forward only), the jnp online softmax elsewhere.

    Returns:
      (float32 output (b, l, n, k), log-sum-exp (b, n, l)).
    """
    if tpu:
        return splash_block(q, k, v, valid, scale=scale)
    return attend_blocks(q, k, v, scale=scale, valid=valid)


def _splash_length(length: int) -> int:
    """Padded length for splash: a multiple of LANE, and of the largest block once longer.

    The kernel's block-sparsity metadata lives in SMEM (1 MiB on v5e) and grows with the
    square of the block count: 75,600 tokens in blocks of 128 (75,648 = 128 x 591) overflow
    it, in blocks of 512 they use a sixteenth.
    """
    unit = _SPLASH_BLOCKS[0] if length > _SPLASH_BLOCKS[0] else LANE
    return -(-length // unit) * unit


def splash_block(q, k, v, valid, *, scale, residuals: bool = True, interpret: bool = False):
    """Splash attention of one device's q over its k/v; keys from `valid` on are masked.

    Args:
      q: (b, l, n, k) queries; k, v: (b, s, n, k) keys and values (as many heads as q).
      valid: int (traced or static) keys counted from the start; the rest are masked.
      scale: logit scale.
      residuals: also return the log-sum-exp. Forward only: jax's splash kernel has no
        derivative when it saves its residuals.
      interpret: run the Pallas kernel in interpret mode (any backend, for tests).

    Returns:
      (output (b, l, n, k): float32 with residuals, else q's dtype; log-sum-exp (b, n, l) or
      None).
    """
    # Imported here, not at the top: only TPU meshes (and interpret-mode tests) run the kernel.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b, length, n, d = q.shape
    s = k.shape[1]
    lp, sp = _splash_length(length), _splash_length(s)
    bq = next(x for x in _SPLASH_BLOCKS if lp % x == 0)
    bkv = next(x for x in _SPLASH_BLOCKS if sp % x == 0)

    def to_rows(x, m):  # (b, l, n, k) -> (b * n, 1, m, k), tokens padded to m
        x = jnp.pad(x, ((0, 0), (0, m - x.shape[1]), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
        return x.reshape(b * n, 1, m, d)

    qh = to_rows((q.astype(jnp.float32) * scale).astype(q.dtype), lp)
    kh, vh = to_rows(k, sp), to_rows(v, sp)
    # One head per kernel call, vmapped over batch x heads: the kernel's block-mask metadata
    # lives in SMEM (1 MiB on v5e) per head, and at 75,600 tokens a multi-head mask overflows
    # it.
    kernel = sk.make_splash_mha(
        sm.MultiHeadMask([sm.FullMask((lp, sp))]),
        block_sizes=sk.BlockSizes(
            block_q=bq,
            block_kv=bkv,
            block_kv_compute=bkv,
            block_q_dkv=bq,
            block_kv_dkv=bkv,
            block_kv_dkv_compute=bkv,
            block_q_dq=bq,
            block_kv_dq=bkv,
        ),
        head_shards=1,
        q_seq_shards=1,
        save_residuals=residuals,
        interpret=interpret,
    )
    # Padded keys get their own segment: no real query attends to them.
    kv_seg = (jnp.arange(sp) >= valid).astype(jnp.int32)
    segments = sk.SegmentIds(q=jnp.zeros((lp,), jnp.int32), kv=kv_seg)
    result = jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=segments))(qh, kh, vh)
    if residuals:
        out, (lse,) = result
        lse = lse.reshape(b, n, lp)
    else:
        out, lse = result, None
    out = out.reshape(b, n, lp, d)
    if residuals:
        lse = lse[:, :, :length]
        # A shard with no valid key contributes nothing (the kernel's rows are undefined there).
        lse = jnp.where(valid > 0, lse, -jnp.inf)
        out = jnp.where(valid > 0, out.astype(jnp.float32), 0.0)
    return out.transpose(0, 2, 1, 3)[:, :length], lse
