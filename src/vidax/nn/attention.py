"""The attention core: the single switch between implementations.

Every model calls `attention(q, k, v, impl=...)`:
- "reference": plain einsum/softmax with float32 logits, the spec;
- "xla": `jax.nn.dot_product_attention`'s XLA path (materialises the `(l, s)` logits);
- "cudnn": cuDNN's fused flash attention (`jax.nn.dot_product_attention(...,
  implementation="cudnn")`): NVIDIA GPUs (sm80+), bf16/fp16 q/k/v, head dims that are multiples
  of 8 up to 128 (256 from Hopper), no mask; the logits never exist in memory;
- "chunked": online softmax over key blocks in plain jnp (float32 accumulators), so the
  `(l, s)` logits never exist at once; the XLA fallback for long sequences;
- "splash": jax's Pallas TPU splash-attention kernel, per device under `shard_map` with the
  layout the active sharding strategy gives q/k/v, or on the one device without a mesh (TPUs
  only);
- "ring": ring attention over the `seq` mesh axis (`vidax.nn.ring_attention`);
- "auto": "ring" when the active strategy asks for it (`Strategy.ring`), "splash" on an active
  TPU mesh, else `choose_impl`: "cudnn" on a GPU wherever it takes the inputs, otherwise
  when the logits would exceed `CHUNKED_ABOVE` elements "splash" on a TPU (no mask) or
  "chunked", else "xla". A GPU that falls back logs why, once per reason.

Which mesh layout the sharded paths use comes from `vidax.sharding.current()`: q is laid out
as `("batch", "attn_tokens", "attn_heads", "head_dim")`, k/v as `"kv_tokens"` for
self-attention (as many keys as queries) and `"text_tokens"` otherwise.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from vidax.nn.ring_attention import ring_attention, splash_attention
from vidax.nn.softmax import KEY_BLOCK, attend_blocks
from vidax.sharding.rules import current, logical_to_spec

IMPLEMENTATIONS = ("auto", "reference", "xla", "cudnn", "chunked", "splash", "ring")

# "auto" switches to "chunked" above this many logits (b*n*l*s): 2^28 float32 logits are 1 GiB.
CHUNKED_ABOVE = 1 << 28

_LOW_PRECISION = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_log = logging.getLogger(__name__)
# Fallback reasons already logged: "auto" runs at every trace, the log line once per reason.
_REPORTED: set[str] = set()


def attention(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b s n k"],
    v: Float[Array, "b s n k"],
    *,
    mask: Bool[Array, "b n l s"] | None = None,
    scale: float | None = None,
    impl: str = "auto",
) -> Float[Array, "b l n k"]:
    """Scaled dot-product attention; `mask` is True where a query may attend.

    A query whose mask row is all False gets the mean of `v` (as `jax.nn.dot_product_attention`
    does), not zeros: callers that can produce empty rows must handle them.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; choose from {IMPLEMENTATIONS}")
    if q.shape[-1] != k.shape[-1] or k.shape != v.shape:
        raise ValueError(f"attention shapes q={q.shape} k={k.shape} v={v.shape} do not match")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if impl == "auto":
        impl = _auto_impl(q, k, v, mask)
    elif impl == "cudnn":
        platform, capability = _device()
        why_not = _cudnn_unsupported(
            platform, q.shape, _common_dtype(q, k, v), mask is not None, capability
        )
        if why_not is not None:
            raise ValueError(f"attention impl 'cudnn' cannot run here: {why_not}")
    if impl == "reference":
        return attention_reference(q, k, v, mask=mask, scale=scale)
    if impl == "chunked":
        return attention_chunked(q, k, v, mask=mask, scale=scale)
    if impl in ("ring", "splash"):
        if mask is not None:
            raise ValueError(f"attention impl {impl!r} does not take a mask")
        if impl == "ring":
            return ring_attention(q, k, v, scale=scale)
        return splash_attention(q, k, v, scale=scale)
    # jax.nn.dot_product_attention promotes bf16 against float32 internally, which strict
    # promotion (our test setting) rejects; the promotion is intended there.
    with jax.numpy_dtype_promotion("standard"):
        if impl == "cudnn":
            return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    return out.astype(q.dtype)


def choose_impl(
    platform: str,
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    dtype,
    has_mask: bool,
    *,
    compute_capability: tuple[int, int] | None = None,
    tokens_sharded: bool = False,
    devices: int = 1,
) -> tuple[str, str]:
    """The "auto" implementation off a TPU mesh and outside ring attention, from static facts.

    Args:
        platform: "gpu", "cpu", "tpu", ... (the active mesh's devices, else the default backend).
        q_shape: (b, l, n, k) queries; k_shape: (b, s, n, k) keys/values (cross-attention when
            s != l, which takes the same path).
        dtype: the dtype q, k and v share, or None when they differ.
        has_mask: a boolean mask is passed.
        compute_capability: the GPU's CUDA (major, minor), None where it is not a CUDA device.
        tokens_sharded: the active strategy splits q or k/v over tokens, or lays them out
            differently (cuDNN's partitioner splits batch and heads only).
        devices: devices the computation may span without a vidax mesh (a splash call is not
            partitioned by GSPMD: one device only).

    Returns:
        (impl, reason): "cudnn" where cuDNN flash attention takes the inputs on a GPU;
        otherwise "chunked" when the logits would exceed `CHUNKED_ABOVE` elements ("splash"
        on a TPU, without a mask), else "xla", with why cuDNN was not used.
    """
    b, length, n, _ = q_shape
    fallback = "chunked" if b * n * length * k_shape[1] > CHUNKED_ABOVE else "xla"
    one_kernel = devices == 1 and q_shape[2] == k_shape[2] and dtype is not None
    if platform == "tpu" and fallback == "chunked" and not has_mask and one_kernel:
        # On a TPU v5e the Pallas kernel is 1.6-3x faster than the jnp online softmax at Sparse
        # Forcing's decode sizes (docs/sparse_forcing.md); short sequences stay on XLA.
        return "splash", "long sequence on a TPU: the splash attention kernel"
    why_not = _cudnn_unsupported(
        platform, q_shape, dtype, has_mask, compute_capability, tokens_sharded
    )
    if why_not is None:
        return "cudnn", "cuDNN flash attention takes these inputs"
    return fallback, f"not cuDNN flash attention ({why_not}): {fallback}"


def _cudnn_unsupported(
    platform, q_shape, dtype, has_mask, capability, tokens_sharded=False
) -> str | None:
    """Why cuDNN flash attention cannot take these inputs (None when it can).

    The limits are those jax checks before calling cuDNN (`check_layout` and
    `check_is_flash_attention` in jax/_src/cudnn/fused_attention_stablehlo.py).
    """
    head_dim = q_shape[-1]
    if platform != "gpu":
        return f"it needs an NVIDIA GPU, running on {platform}"
    if capability is None:
        return "not a CUDA device"
    if capability < (8, 0):
        return f"compute capability {capability[0]}.{capability[1]} is below 8.0"
    if dtype is None:
        return "q, k and v have different dtypes"
    if jnp.dtype(dtype) not in _LOW_PRECISION:
        return f"{jnp.dtype(dtype).name} inputs; it takes bfloat16/float16"
    max_head = 256 if capability >= (9, 0) else 128
    if head_dim % 8 or head_dim > max_head:
        return f"head dim {head_dim}; it takes multiples of 8 up to {max_head}"
    if has_mask:
        return "a boolean mask; it takes none"
    if tokens_sharded:
        return "q/k/v split over tokens; its partitioner splits batch and heads only"
    return None


def _common_dtype(q, k, v):
    return q.dtype if q.dtype == k.dtype == v.dtype else None


def _device(mesh=None) -> tuple[str, tuple[int, int] | None]:
    """(platform, CUDA compute capability or None) of the mesh's devices, else the default."""
    device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
    capability = None
    if device.platform == "gpu":
        try:  # "9.0" on CUDA devices; absent or not numeric elsewhere (ROCm)
            major, minor = str(device.compute_capability).split(".")[:2]
            capability = (int(major), int(minor))
        except (AttributeError, ValueError):
            capability = None
    return device.platform, capability


def _auto_impl(q, k, v, mask) -> str:
    active = current()
    mesh = None
    if active is not None:
        mesh, strategy = active
        if mask is None:
            if strategy.ring and mesh.shape.get("seq", 1) > 1 and q.shape[1] == k.shape[1]:
                return "ring"
            if mesh.devices.flat[0].platform == "tpu":
                return "splash"
    platform, capability = _device(mesh)
    impl, reason = choose_impl(
        platform,
        q.shape,
        k.shape,
        _common_dtype(q, k, v),
        mask is not None,
        compute_capability=capability,
        tokens_sharded=platform == "gpu" and active is not None and _tokens_sharded(q, k, *active),
        devices=jax.device_count() if mesh is None else mesh.size,
    )
    if platform == "gpu" and impl != "cudnn" and reason not in _REPORTED:
        _REPORTED.add(reason)
        _log.warning("vidax attention on GPU: %s", reason)
    return impl


def _tokens_sharded(q, k, mesh, strategy) -> bool:
    """Whether the strategy splits q or k/v over tokens, or lays them out differently."""
    q_axes = ("batch", "attn_tokens", "attn_heads", "head_dim")
    kv_axes = ("batch", "kv_tokens" if q.shape[1] == k.shape[1] else "text_tokens", *q_axes[2:])
    rules, pad = strategy.activations, strategy.pad
    q_spec = logical_to_spec(q_axes, rules, mesh, q.shape, pad=pad)
    k_spec = logical_to_spec(kv_axes, rules, mesh, k.shape, pad=pad)
    return q_spec[1] is not None or q_spec != k_spec


def attention_reference(q, k, v, *, mask=None, scale: float):
    """softmax(q k^T * scale) v with float32 logits and accumulation."""
    logits = jnp.einsum("blnk,bsnk->bnls", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bnls,bsnk->blnk", probs, v.astype(jnp.float32)).astype(q.dtype)


def attention_chunked(q, k, v, *, mask=None, scale: float, block: int = KEY_BLOCK):
    """Online-softmax attention over key blocks of `block` (padded keys are masked out)."""
    out, lse = attend_blocks(q, k, v, scale=scale, mask=mask, block=block)
    del lse
    return out.astype(q.dtype)
