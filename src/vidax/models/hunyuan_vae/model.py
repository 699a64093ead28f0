"""The HunyuanVideo (1.0) causal 3D VAE (diffusers `AutoencoderKLHunyuanVideo`) in NNX.

Channels-last throughout. Convolutions are causal in time and pad by replicating edge frames and
pixels. GroupNorm statistics span the whole clip and the middle blocks attend over every latent
position of earlier and current frames, so unlike Wan's VAE the clip cannot be streamed through
with a per-layer cache. Memory is bounded the way diffusers bounds it: overlapping temporal tiles
(on by default, as in diffusers) and spatial tiles (`Tiling`), cross-faded over their overlap.
Tiles of one shape run under one `lax.map`, so a long or large video compiles the encoder or
decoder once per distinct tile shape (at most a handful) and holds one tile's activations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vidax.models.hunyuan_vae.config import HunyuanVideoVAEConfig, Tiling
from vidax.models.video_vae import (
    CONV3D_AXES,
    VIDEO_AXES,
    VideoVAE,
    constant,
    conv_init,
    conv_weights,
    cross_fade,
    last_axis,
)
from vidax.nn.attention import CHUNKED_ABOVE, attention
from vidax.nn.layers import Linear, param
from vidax.sharding import shard

_EPS = 1e-6  # every GroupNorm of the model


class CausalConv3d(nnx.Module):
    """3D convolution, causal in time, padded by replicating edges (diffusers' "replicate").

    The input gains kernel - 1 copies of its first frame in front and kernel // 2 copies of its
    border pixels on each side, then a valid strided convolution runs.

    Args:
      in_dim / out_dim: channels c.
      kernel: cubic kernel size k.
      stride: (temporal, spatial) strides.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        kernel: int = 3,
        *,
        stride: tuple[int, int] = (1, 1),
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.kernel, self.bias = conv_weights(
            rngs, (kernel,) * 3 + (in_dim, out_dim), CONV3D_AXES, param_dtype
        )
        self.size = kernel
        self.stride = stride
        self.dtype = dtype

    def conv(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h2 w2 c2"]:
        """The convolution with spatial padding only (time is padded by the caller)."""
        kernel = self.kernel[...].astype(self.dtype)
        x = x.astype(self.dtype)
        if self.size == 1 and self.stride == (1, 1):
            y = jnp.dot(x, kernel[0, 0, 0])
        else:
            p = self.size // 2
            x = jnp.pad(x, ((0, 0), (0, 0), (p, p), (p, p), (0, 0)), mode="edge")
            y = jax.lax.conv_general_dilated(
                x,
                kernel,
                window_strides=(self.stride[0], self.stride[1], self.stride[1]),
                padding="VALID",
                dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
            )
        return y + last_axis(self.bias[...].astype(self.dtype), y.ndim)

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h2 w2 c2"]:
        """The convolution of a whole clip."""
        return self.chunk(x, None)[0]

    def chunk(
        self, x: Float[Array, "b t h w c"], cache: Float[Array, "b m h w c"] | None
    ) -> tuple[Float[Array, "b t2 h w c2"], Float[Array, "b m h w c"] | None]:
        """The convolution of one chunk of a clip streamed through in time order.

        Args:
          x: this chunk.
          cache: the last m = kernel - 1 input frames before it; None at the clip's start,
            where copies of its first frame stand in (replicate padding).

        Returns:
          The output and the new cache (None for 1x1x1 kernels).
        """
        history = self.size - 1
        if history == 0:
            return self.conv(x), None
        x = x.astype(self.dtype)
        front = jnp.repeat(x[:, :1], history, axis=1) if cache is None else cache
        x = jnp.concatenate([front.astype(self.dtype), x], axis=1)
        return self.conv(x), x[:, -history:]


class GroupNorm(nnx.Module):
    """torch `nn.GroupNorm` over channels-last video: statistics per sample and channel group,
    over all frames and pixels, in float32."""

    def __init__(self, dim: int, groups: int, *, param_dtype: jnp.dtype = jnp.float32):
        self.scale = param(constant(1.0, (dim,), param_dtype), ("norm",))
        self.bias = param(constant(0.0, (dim,), param_dtype), ("norm",))
        self.groups = groups

    def __call__(self, x: Float[Array, "b ... c"]) -> Float[Array, "b ... c"]:
        xf = x.astype(jnp.float32)
        g = xf.reshape(*x.shape[:-1], self.groups, x.shape[-1] // self.groups)
        axes = (*range(1, x.ndim - 1), x.ndim)
        mean = jnp.mean(g, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(g - mean), axis=axes, keepdims=True)
        y = ((g - mean) * jax.lax.rsqrt(var + _EPS)).reshape(x.shape)
        scale = last_axis(self.scale[...].astype(jnp.float32), x.ndim)
        bias = last_axis(self.bias[...].astype(jnp.float32), x.ndim)
        return (y * scale + bias).astype(x.dtype)


def _silu_norm(norm: GroupNorm, x: Array) -> Array:
    return jax.nn.silu(norm(x))


class ResnetBlock(nnx.Module):
    """conv2(silu(norm2(conv1(silu(norm1 x))))) + shortcut(x); causal 3x3x3 convs."""

    def __init__(self, in_dim: int, out_dim: int, groups: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm1 = GroupNorm(in_dim, groups, param_dtype=param_dtype)
        self.conv1 = CausalConv3d(in_dim, out_dim, **kw)
        self.norm2 = GroupNorm(out_dim, groups, param_dtype=param_dtype)
        self.conv2 = CausalConv3d(out_dim, out_dim, **kw)
        self.conv_shortcut = CausalConv3d(in_dim, out_dim, 1, **kw) if in_dim != out_dim else None

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c2"]:
        y = self.conv1(_silu_norm(self.norm1, x))
        y = self.conv2(_silu_norm(self.norm2, y))
        shortcut = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return y + shortcut.astype(y.dtype)


def frame_causal_attention(
    q: Float[Array, "b l n k"], k: Float[Array, "b l n k"], v: Float[Array, "b l n k"], frames: int
) -> Float[Array, "b l n k"]:
    """Attention where tokens of frame f (l = frames * hw, frame-major) see frames 0..f.

    Equals one masked attention (diffusers' `prepare_causal_attention_mask`) without building
    the (l, l) mask: each frame's queries attend to the key prefix it may see.
    """
    b, tokens, n, _ = q.shape
    hw = tokens // frames
    outs = []
    for f in range(frames):
        keys = (f + 1) * hw
        # Large VAE tiles have long sequences with one wide head; switch to the online-softmax
        # path before the logits outgrow memory (not "auto": no TPU kernel takes k = c).
        impl = "chunked" if b * n * hw * keys > CHUNKED_ABOVE else "xla"
        qf = q[:, f * hw : (f + 1) * hw]
        outs.append(attention(qf, k[:, :keys], v[:, :keys], impl=impl))
    return jnp.concatenate(outs, axis=1)


class AttentionBlock(nnx.Module):
    """x + to_out(attn(norm x)): one head as wide as the channels, frame-causal."""

    def __init__(self, dim: int, groups: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(
            axes=("conv_in", "conv_out"), dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )
        self.group_norm = GroupNorm(dim, groups, param_dtype=param_dtype)
        self.to_q = Linear(dim, dim, kernel_init=conv_init, **kw)
        self.to_k = Linear(dim, dim, kernel_init=conv_init, **kw)
        self.to_v = Linear(dim, dim, kernel_init=conv_init, **kw)
        self.to_out = Linear(dim, dim, kernel_init=conv_init, **kw)

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c"]:
        b, t, h, w, c = x.shape
        y = self.group_norm(x).reshape(b, t * h * w, 1, c)
        o = frame_causal_attention(self.to_q(y), self.to_k(y), self.to_v(y), t)
        return x + self.to_out(o).reshape(x.shape).astype(x.dtype)


class MidBlock(nnx.Module):
    """Residual block, optional attention, residual block at the lowest resolution."""

    def __init__(self, dim: int, groups: int, attend: bool, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.resnets = nnx.List([ResnetBlock(dim, dim, groups, **kw) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, groups, **kw)] if attend else [])

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c"]:
        x = self.resnets[0](x)
        if len(self.attentions):
            x = self.attentions[0](x)
        return self.resnets[1](x)


class Downsample(nnx.Module):
    """A strided causal 3x3x3 conv: (temporal, spatial) strides of 1 or 2."""

    def __init__(self, dim: int, factors: tuple[int, int], *, dtype, param_dtype, rngs):
        self.conv = CausalConv3d(
            dim, dim, stride=factors, dtype=dtype, param_dtype=param_dtype, rngs=rngs
        )

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h2 w2 c"]:
        return self.conv(x)


class Upsample(nnx.Module):
    """Nearest-neighbour upsampling, then a causal 3x3x3 conv.

    With temporal upsampling every frame but the first is repeated twice, so t latent frames
    become 1 + 2 (t - 1): frame 0 stays the lone causal "image" frame.
    """

    def __init__(self, dim: int, factors: tuple[int, int], *, dtype, param_dtype, rngs):
        self.conv = CausalConv3d(dim, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.factors = factors

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h2 w2 c"]:
        temporal, spatial = self.factors
        if temporal > 1 and x.shape[1] > 1:
            x = jnp.concatenate([x[:, :1], jnp.repeat(x[:, 1:], temporal, axis=1)], axis=1)
        if spatial > 1:
            x = jnp.repeat(jnp.repeat(x, spatial, axis=2), spatial, axis=3)
        return self.conv(x)


class Stage(nnx.Module):
    """`num` residual blocks, then an optional resampler (diffusers' down/up block)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        num: int,
        groups: int,
        resample: type[Downsample] | type[Upsample],
        factors: tuple[int, int],
        *,
        dtype,
        param_dtype,
        rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.resnets = nnx.List(
            [ResnetBlock(in_dim if j == 0 else out_dim, out_dim, groups, **kw) for j in range(num)]
        )
        self.resampler = resample(out_dim, factors, **kw) if factors != (1, 1) else None

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h2 w2 c2"]:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.resampler is None else self.resampler(x)


def _kw(config: HunyuanVideoVAEConfig, rngs: nnx.Rngs) -> dict:
    return dict(dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype), rngs=rngs)


class Encoder(nnx.Module):
    """Pixels (b, T, H, W, c_in) -> moments (b, t, H / s, W / s, 2 z), on a whole clip."""

    def __init__(self, config: HunyuanVideoVAEConfig, *, rngs: nnx.Rngs):
        kw = _kw(config, rngs)
        c, g = config.block_out_channels, config.norm_num_groups
        self.conv_in = CausalConv3d(config.in_channels, c[0], **kw)
        self.down_blocks = nnx.List(
            [
                Stage(i, o, config.layers_per_block, g, Downsample, f, **kw)
                for i, o, f in config.encoder_layout
            ]
        )
        self.mid_block = MidBlock(c[-1], g, config.mid_block_add_attention, **kw)
        self.conv_norm_out = GroupNorm(c[-1], g, param_dtype=kw["param_dtype"])
        self.conv_out = CausalConv3d(c[-1], 2 * config.z_dim, **kw)

    def __call__(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h2 w2 z2"]:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(_silu_norm(self.conv_norm_out, x))


class Decoder(nnx.Module):
    """Latents (b, t, h, w, z) -> pixels (b, 1 + 4 (t - 1), h s, w s, c_out), on a whole clip."""

    def __init__(self, config: HunyuanVideoVAEConfig, *, rngs: nnx.Rngs):
        kw = _kw(config, rngs)
        c, g = config.block_out_channels, config.norm_num_groups
        self.conv_in = CausalConv3d(config.z_dim, c[-1], **kw)
        self.mid_block = MidBlock(c[-1], g, config.mid_block_add_attention, **kw)
        self.up_blocks = nnx.List(
            [
                Stage(i, o, config.layers_per_block + 1, g, Upsample, f, **kw)
                for i, o, f in config.decoder_layout
            ]
        )
        self.conv_norm_out = GroupNorm(c[0], g, param_dtype=kw["param_dtype"])
        self.conv_out = CausalConv3d(c[0], config.out_channels, **kw)

    def __call__(self, z: Float[Array, "b t h w z"]) -> Float[Array, "b t2 h2 w2 c"]:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(_silu_norm(self.conv_norm_out, x))


# ------------------------------------------------------------------------------ tiling


def map_windows(
    fn: Callable[[Array], Array],
    x: Array,
    windows: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
    axes: tuple[int, ...],
) -> list[Array]:
    """fn applied to each (starts, sizes) window of x along `axes`, in order.

    Windows of one size run under a single `lax.map` over their start offsets, so fn is traced
    once per distinct size and only one window's intermediates are live at a time.
    """
    groups: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
    for n, (starts, sizes) in enumerate(windows):
        groups.setdefault(tuple(sizes), []).append((n, tuple(starts)))
    out: list[Array | None] = [None] * len(windows)
    for sizes, members in groups.items():
        shape = list(x.shape)
        for axis, size in zip(axes, sizes, strict=True):
            shape[axis] = size

        def crop(starts, shape=shape):
            index = [0] * x.ndim
            for axis, start in zip(axes, starts, strict=True):
                index[axis] = start
            return jax.lax.dynamic_slice(x, index, shape)

        if len(members) == 1:
            n, starts = members[0]
            out[n] = fn(crop(starts))
            continue
        offsets = jnp.asarray([starts for _, starts in members], jnp.int32)
        ys = jax.lax.map(lambda s: fn(crop(tuple(s[i] for i in range(len(axes))))), offsets)
        for k, (n, _) in enumerate(members):
            out[n] = ys[k]
    return out  # type: ignore[return-value]


def tiled_2d(
    fn: Callable[[Array], Array],
    x: Float[Array, "b t h w c"],
    *,
    tile: int,
    stride: int,
    scale: float,
) -> Array:
    """fn on overlapping (tile x tile) windows of x every `stride`, cross-faded (diffusers).

    Output tiles are blended over their overlap with the (already blended) tiles above and to
    the left, cut to the output stride and joined; the result is cropped to x's size * scale.
    Edge windows are smaller (clipped to x), exactly as diffusers slices them.
    """
    h, w = x.shape[2:4]
    rows, cols = range(0, h, stride), range(0, w, stride)
    windows = [((i, j), (min(tile, h - i), min(tile, w - j))) for i in rows for j in cols]
    tiles = map_windows(fn, x, windows, axes=(2, 3))
    blend, keep = round((tile - stride) * scale), round(stride * scale)
    grid: list[list[Array]] = []
    for r in range(len(rows)):
        row: list[Array] = []
        for col in range(len(cols)):
            t = tiles[r * len(cols) + col]
            if r:
                t = cross_fade(grid[-1][col], t, blend, axis=2)
            if col:
                t = cross_fade(row[-1], t, blend, axis=3)
            row.append(t)
        grid.append(row)
    out = jnp.concatenate(
        [jnp.concatenate([t[:, :, :keep, :keep] for t in row], axis=3) for row in grid], axis=2
    )
    return out[:, :, : round(h * scale), : round(w * scale)]


def tiled_frames(
    fn: Callable[[Array], Array],
    x: Float[Array, "b t h w c"],
    *,
    tile: int,
    stride: int,
    keep: int,
    blend: int,
    total: int,
) -> Array:
    """fn on windows of `tile` frames every `stride` frames, cross-faded (diffusers' framewise).

    Every window but the first drops its first output frame (the causal "image" frame that
    overlaps its predecessor), is blended over `blend` frames with the previous (blended)
    window and cut to `keep` frames; the first keeps `keep + 1`. The result has `total` frames.
    A last window of a single frame outputs nothing after the drop, so it is skipped.
    """
    t = x.shape[1]
    windows = [((i,), (min(tile, t - i),)) for i in range(0, t, stride) if i == 0 or t - i > 1]
    pieces: list[Array] = []
    prev: Array | None = None
    for n, y in enumerate(map_windows(fn, x, windows, axes=(1,))):
        if prev is not None:  # every window but the first
            y = cross_fade(prev, y[:, 1:], blend, axis=1)
        pieces.append(y[:, : keep + (n == 0)])
        prev = y
    return jnp.concatenate(pieces, axis=1)[:, :total]


# ------------------------------------------------------------------------------ the VAE


class HunyuanVideoVAE(VideoVAE):
    """The HunyuanVideo VAE: causal 3D conv encoder/decoder with a diagonal Gaussian latent.

    Latents are *scaled*: `encode` returns mu * scaling_factor and `decode` divides by it, as
    the diffusers pipelines do around the VAE. `moments` and `decode_raw` are the traceable,
    unscaled pieces (for training inside your own transforms).
    """

    def __init__(self, config: HunyuanVideoVAEConfig, *, rngs: nnx.Rngs):
        self.config = config
        kw = _kw(config, rngs)
        z = config.z_dim
        self.encoder = Encoder(config, rngs=rngs)
        self.decoder = Decoder(config, rngs=rngs)
        self.quant_conv = CausalConv3d(2 * z, 2 * z, 1, **kw)
        self.post_quant_conv = CausalConv3d(z, z, 1, **kw)

    # ---------------------------------------------------------------- checks

    def _tiling(self, tiling: Tiling | None) -> Tiling:
        tiling = self.config.tiling if tiling is None else tiling
        tiling.check(self.config.spatial_factor, self.config.temporal_factor)
        return tiling

    # ---------------------------------------------------------------- traceable pieces

    def moments(
        self, x: Float[Array, "b T H W c"], *, tiling: Tiling | None = None
    ) -> tuple[Float[Array, "b t h w z"], Float[Array, "b t h w z"]]:
        """Unscaled posterior mean and log-variance of a video.

        Args:
          x: pixels in [-1, 1]; T = 1 + 4k frames, H and W multiples of the spatial factor.
          tiling: overrides `config.tiling`.

        Returns:
          (mu, logvar), each (b, 1 + (T - 1) / 4, H / s, W / s, z_dim); logvar clipped to
          [-30, 20] as diffusers' `DiagonalGaussianDistribution` does.
        """
        self._check_video(x)
        cfg, tiling = self.config, self._tiling(tiling)
        s, tf = cfg.spatial_factor, cfg.temporal_factor

        def whole(v):
            return self.quant_conv(self.encoder(v))

        def spatial(v):
            if tiling.size is None or max(v.shape[2:4]) <= tiling.size:
                return whole(v)
            return tiled_2d(whole, v, tile=tiling.size, stride=tiling.stride, scale=1 / s)

        x = shard(x.astype(jnp.dtype(cfg.dtype)), VIDEO_AXES)
        frames = x.shape[1]
        if tiling.frames is not None and frames > tiling.frames:
            h = tiled_frames(
                spatial,
                x,
                tile=tiling.frames + 1,
                stride=tiling.frames_stride,
                keep=tiling.frames_stride // tf,
                blend=(tiling.frames - tiling.frames_stride) // tf,
                total=cfg.latent_frames(frames),
            )
        else:
            h = spatial(x)
        mu, logvar = jnp.split(h, 2, axis=-1)
        return mu, jnp.clip(logvar, -30.0, 20.0)

    def decode_raw(
        self, z: Float[Array, "b t h w z"], *, tiling: Tiling | None = None
    ) -> Float[Array, "b T H W c"]:
        """Unscaled latents -> pixels, unclamped.

        Args:
          z: raw latents (diffusers' `vae.decode` input).
          tiling: overrides `config.tiling`.

        Returns:
          (b, 1 + 4 (t - 1), h * s, w * s, out_channels).
        """
        self._check_latents(z)
        cfg, tiling = self.config, self._tiling(tiling)
        s, tf = cfg.spatial_factor, cfg.temporal_factor

        def whole(v):
            return self.decoder(self.post_quant_conv(v))

        def spatial(v):
            if tiling.size is None or max(v.shape[2:4]) <= tiling.size // s:
                return whole(v)
            return tiled_2d(whole, v, tile=tiling.size // s, stride=tiling.stride // s, scale=s)

        z = shard(z.astype(jnp.dtype(cfg.dtype)), VIDEO_AXES)
        t = z.shape[1]
        if tiling.frames is not None and t > tiling.frames // tf:
            return tiled_frames(
                spatial,
                z,
                tile=tiling.frames // tf + 1,
                stride=tiling.frames_stride // tf,
                keep=tiling.frames_stride,
                blend=tiling.frames - tiling.frames_stride,
                total=cfg.video_frames(t),
            )
        return spatial(z)

    # ---------------------------------------------------------------- user API

    def encode(
        self, x: Float[Array, "b T H W c"], *, tiling: Tiling | None = None
    ) -> Float[Array, "b t h w z"]:
        """Scaled posterior mode mu * scaling_factor of a video in [-1, 1].

        Args:
          x: (b, T, H, W, in_channels), T = 1 + 4k, H and W multiples of the spatial factor.
          tiling: overrides `config.tiling` (`NO_TILING`: the whole clip at once).

        Returns:
          (b, 1 + (T - 1) / 4, H / s, W / s, z_dim), what the diffusion transformer sees.
        """
        self._check_video(x)
        return _encode_jit(self, x, self._tiling(tiling))

    def decode(
        self, z: Float[Array, "b t h w z"], *, tiling: Tiling | None = None
    ) -> Float[Array, "b T H W c"]:
        """Scaled latents -> pixels clamped to [-1, 1].

        Args:
          z: (b, t, h, w, z_dim) latents as `encode` returns them (scaled).
          tiling: overrides `config.tiling` (`NO_TILING`: the whole clip at once).

        Returns:
          (b, 1 + 4 (t - 1), h * s, w * s, out_channels).
        """
        self._check_latents(z)
        return _decode_jit(self, z, self._tiling(tiling))


@nnx.jit(static_argnames=("tiling",))
def _encode_jit(vae: HunyuanVideoVAE, x, tiling):
    mu, _ = vae.moments(x, tiling=tiling)
    return mu * jnp.asarray(vae.config.scaling_factor, mu.dtype)


@nnx.jit(static_argnames=("tiling",))
def _decode_jit(vae: HunyuanVideoVAE, z, tiling):
    z = z.astype(jnp.dtype(vae.config.dtype))
    x = vae.decode_raw(z / jnp.asarray(vae.config.scaling_factor, z.dtype), tiling=tiling)
    return jnp.clip(x, -1.0, 1.0)
