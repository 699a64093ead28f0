"""Leaf layers with logical-axis annotations on every parameter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

Axes = tuple[str | None, ...]


def param(value: jax.Array, axes: Axes) -> nnx.Param:
    """A parameter carrying logical axis names (resolved to a mesh by `vidax.sharding`)."""
    if len(axes) != value.ndim:
        raise ValueError(f"{len(axes)} logical axes {axes} for a parameter of shape {value.shape}")
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def last_axis(v: Float[Array, " c"], ndim: int) -> Float[Array, "... c"]:
    """A per-channel vector shaped to broadcast against a rank-`ndim` channels-last array: the
    broadcast over leading axes made explicit (tests run with rank promotion = "raise")."""
    return v.reshape((1,) * (ndim - 1) + (-1,))


class Linear(nnx.Module):
    """y = x @ kernel + bias, with kernel (in, out) annotated by `axes`."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        axes: tuple[str | None, str | None],
        use_bias: bool = True,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        kernel_init: Callable | None = None,
        rngs: nnx.Rngs,
    ):
        kernel_init = kernel_init or nnx.initializers.lecun_normal()
        kernel = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
        self.kernel = param(kernel, axes)
        self.bias = param(jnp.zeros((out_features,), param_dtype), (axes[1],)) if use_bias else None
        self.dtype = dtype

    def __call__(self, x: Float[Array, "... i"]) -> Float[Array, "... o"]:
        y = jnp.dot(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + last_axis(self.bias[...].astype(self.dtype), y.ndim)
        return y


class RMSNorm(nnx.Module):
    """x / rms(x) * scale over the last axis, computed in float32."""

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        axes: tuple[str | None] = ("norm",),
        param_dtype: jnp.dtype = jnp.float32,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs  # deterministic init
        self.scale = param(jnp.ones((dim,), param_dtype), axes)
        self.eps = eps

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.eps)
        return (y * last_axis(self.scale[...].astype(jnp.float32), y.ndim)).astype(x.dtype)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis in float32, optionally without affine parameters."""

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        param_dtype: jnp.dtype = jnp.float32,
        rngs: nnx.Rngs | None = None,
    ):
        del rngs
        self.eps = eps
        self.scale = param(jnp.ones((dim,), param_dtype), ("norm",)) if elementwise_affine else None
        self.bias = param(jnp.zeros((dim,), param_dtype), ("norm",)) if elementwise_affine else None

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        return layer_norm(x, self.eps, self.scale, self.bias)


def layer_norm(x, eps: float, scale=None, bias=None):
    """Float32 layer norm of the last axis; returns x's dtype."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    if scale is not None:
        y = y * last_axis(scale[...].astype(jnp.float32), y.ndim)
    if bias is not None:
        y = y + last_axis(bias[...].astype(jnp.float32), y.ndim)
    return y.astype(x.dtype)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """GELU with the tanh approximation (torch's approximate="tanh").

    A module-level function, not a lambda: modules keep their activation as a static
    attribute, and a lambda made per model made two loads of one checkpoint different
    `GraphDef`s, so every compiled-program cache keyed on the graph missed.
    """
    return jax.nn.gelu(x, approximate=True)


class FeedForward(nnx.Module):
    """Linear(d->f) -> activation -> Linear(f->d)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        activation: Callable[[jax.Array], jax.Array] = gelu_tanh,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj_in = Linear(dim, hidden, axes=("embed", "mlp"), **kw)
        self.proj_out = Linear(hidden, dim, axes=("mlp", "embed"), **kw)
        self.activation = activation

    def __call__(self, x: Float[Array, "... d"]) -> Float[Array, "... d"]:
        return self.proj_out(self.activation(self.proj_in(x)))


def modulate(x: Float[Array, "b l d"], shift, scale) -> Float[Array, "b l d"]:
    """adaLN modulation x * (1 + scale) + shift in float32 (shift/scale broadcast over l)."""
    xf = x.astype(jnp.float32)
    return xf * (1.0 + scale.astype(jnp.float32)) + shift.astype(jnp.float32)
