"""The Wan 2.1 and Wan 2.2 causal 3D VAEs (diffusers `AutoencoderKLWan`) in Flax NNX,
channels-last.

Video runs through the encoder and decoder chunk by chunk over time, as in diffusers: the
encoder sees frame 0 alone and then 4-frame chunks, the decoder one latent frame at a time.
Every causal convolution keeps the last frames of its input in a cache that the next chunk
prepends instead of zeros, so chunked and whole-sequence results agree while activations stay
one chunk long. The chunks after the first are a `jax.lax.scan` whose carry is the cache pytree
(fixed shapes), so a video of any length compiles once and peak memory stays flat.

Every temporal module is `(x, cache) -> (y, cache)`. `cache is None` marks the first chunk: convs
pad with zeros, a temporal upsample passes its one frame through (diffusers' "Rep" state), a
temporal downsample keeps its frame and only starts striding from the next chunk.

Wan 2.2 (`is_residual`, `patch_size`) adds two things. Pixels enter the encoder as p x p
patches folded into channels and leave the decoder unfolded (`patchify`, `unpatchify`). Each
encoder stage (`DownBlock`) adds its input averaged down to its output's shape (`avg_down`), and
each decoder up stage adds its input repeated up to its output's (`dup_up`). Both shortcuts are
stateless within a chunk: chunks split time at multiples of the temporal strides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vidax.models.video_vae import (
    CONV3D_AXES,
    VIDEO_AXES,
    Cache,
    ChannelRMSNorm,
    VideoVAE,
    check_video,
    conv_weights,
    cross_fade,
    last_axis,
    run_chunked,
    stream_stage,
    stream_through,
)
from vidax.models.wan_vae.config import CONV_IMPLS, ENCODE_CHUNK, WanVAEConfig
from vidax.nn.attention import attention
from vidax.sharding import shard

_CONV2D_AXES = ("kernel", "kernel", "conv_in", "conv_out")


class CausalConv3d(nnx.Module):
    """3D convolution, causal in time: spatial 'same' padding, past frames in front.

    Args:
      in_dim / out_dim: channels c.
      kernel: (kt, kh, kw); kh and kw odd.
      conv_impl: "native" (one 3D convolution) or "2d-sum" (the sum of kt 2D convolutions over
        shifted frames: the same function up to float summation order; see `CONV_IMPLS`).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        kernel: tuple[int, int, int] = (3, 3, 3),
        *,
        stride_t: int = 1,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        conv_impl: str = "native",
        rngs: nnx.Rngs,
    ):
        if conv_impl not in CONV_IMPLS:
            raise ValueError(f"unknown conv_impl {conv_impl!r}; choose from {CONV_IMPLS}")
        self.kernel, self.bias = conv_weights(
            rngs, (*kernel, in_dim, out_dim), CONV3D_AXES, param_dtype
        )
        self.history = kernel[0] - 1
        self.padding = ((0, 0), ((kernel[1] - 1) // 2,) * 2, ((kernel[2] - 1) // 2,) * 2)
        self.stride_t = stride_t
        self.dtype = dtype
        self.conv_impl = conv_impl

    def conv(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h w c2"]:
        """The convolution alone, without padding in time."""
        if self.conv_impl == "2d-sum":
            return self._conv_2d_sum(x)
        kernel = self.kernel[...].astype(self.dtype)
        x = x.astype(self.dtype)
        if kernel.shape[:3] == (1, 1, 1):
            y = jnp.dot(x, kernel[0, 0, 0])
        else:
            y = jax.lax.conv_general_dilated(
                x,
                kernel,
                window_strides=(self.stride_t, 1, 1),
                padding=self.padding,
                dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
            )
        return y + last_axis(self.bias[...].astype(self.dtype), y.ndim)

    def _conv_2d_sum(self, x: Float[Array, "b t h w c"]) -> Float[Array, "b t2 h w c2"]:
        """`conv` as the sum over d < kt of a 2D convolution of frames d, d + stride, ..."""
        kernel = self.kernel[...].astype(self.dtype)
        x = x.astype(self.dtype)
        kt, kh, kw = kernel.shape[:3]
        stride = self.stride_t
        t_out = (x.shape[1] - kt) // stride + 1
        span = stride * (t_out - 1) + 1
        y: jax.Array | None = None
        for d in range(kt):
            xs = x[:, d : d + span : stride]
            if (kh, kw) == (1, 1):
                part = jnp.dot(xs, kernel[d, 0, 0])
            else:
                flat = xs.reshape(-1, *xs.shape[2:])
                part = jax.lax.conv_general_dilated(
                    flat,
                    kernel[d],
                    window_strides=(1, 1),
                    padding=self.padding[1:],
                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                )
                part = part.reshape(xs.shape[0], t_out, *part.shape[1:])
            y = part if y is None else y + part
        assert y is not None  # kt >= 1 taps
        return y + last_axis(self.bias[...].astype(self.dtype), y.ndim)

    def __call__(
        self, x: Float[Array, "b t h w c"], cache: Float[Array, "b m h w c"] | None = None
    ) -> tuple[Float[Array, "b t h w c2"], Float[Array, "b m h w c"] | None]:
        """Convolves x after the last m = kt - 1 input frames of the previous chunk.

        Args:
          x: this chunk.
          cache: the previous chunk's last m input frames; None (zeros) for the first chunk.

        Returns:
          The output and the new cache: the last m frames of [cache, x] (None if kt == 1).
        """
        if self.history == 0:
            return self.conv(x), None
        x = x.astype(self.dtype)
        if cache is None:
            cache = jnp.zeros((x.shape[0], self.history, *x.shape[2:]), x.dtype)
        x = jnp.concatenate([cache, x], axis=1)
        return self.conv(x), x[:, -self.history :]


class Conv2d(nnx.Module):
    """Per-frame 2D convolution with explicit ((top, bottom), (left, right)) zero padding."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        kernel: int = 3,
        *,
        stride: int = 1,
        padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0)),
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.kernel, self.bias = conv_weights(
            rngs, (kernel, kernel, in_dim, out_dim), _CONV2D_AXES, param_dtype
        )
        self.stride = stride
        self.padding = padding
        self.dtype = dtype

    def __call__(self, x: Float[Array, "... h w c"]) -> Float[Array, "... h2 w2 c2"]:
        kernel = self.kernel[...].astype(self.dtype)
        x = x.astype(self.dtype)
        if kernel.shape[:2] == (1, 1):
            y = jnp.dot(x, kernel[0, 0])
        else:
            lead = x.shape[:-3]
            y = jax.lax.conv_general_dilated(
                x.reshape(-1, *x.shape[-3:]),
                kernel,
                window_strides=(self.stride, self.stride),
                padding=self.padding,
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
            y = y.reshape(*lead, *y.shape[1:])
        return y + last_axis(self.bias[...].astype(self.dtype), y.ndim)


class ResidualBlock(nnx.Module):
    """conv2(silu(norm2(conv1(silu(norm1 x))))) + shortcut(x); both convs causal 3x3x3."""

    def __init__(
        self, in_dim: int, out_dim: int, *, dtype, param_dtype, conv_impl: str, rngs: nnx.Rngs
    ):
        kw: dict[str, Any] = dict(
            dtype=dtype, param_dtype=param_dtype, conv_impl=conv_impl, rngs=rngs
        )
        self.norm1 = ChannelRMSNorm(in_dim, param_dtype=param_dtype)
        self.conv1 = CausalConv3d(in_dim, out_dim, **kw)
        self.norm2 = ChannelRMSNorm(out_dim, param_dtype=param_dtype)
        self.conv2 = CausalConv3d(out_dim, out_dim, **kw)
        self.conv_shortcut = (
            CausalConv3d(in_dim, out_dim, (1, 1, 1), **kw) if in_dim != out_dim else None
        )

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        c1, c2 = (None, None) if cache is None else cache
        shortcut = x if self.conv_shortcut is None else self.conv_shortcut(x)[0]
        y, c1 = self.conv1(jax.nn.silu(self.norm1(x)), c1)
        y, c2 = self.conv2(jax.nn.silu(self.norm2(y)), c2)
        return y + shortcut.astype(y.dtype), (c1, c2)


class AttentionBlock(nnx.Module):
    """Single-head self-attention over the h*w positions of each frame, plus the residual."""

    def __init__(self, dim: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = ChannelRMSNorm(dim, param_dtype=param_dtype)
        self.to_qkv = Conv2d(dim, 3 * dim, 1, **kw)
        self.proj = Conv2d(dim, dim, 1, **kw)

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache = None) -> tuple[Array, Cache]:
        b, t, h, w, c = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(b * t, h * w, 1, 3 * c)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        # "xla", not "auto": the head dim is the full channel width (384 in Wan 2.1), beyond
        # what flash-style kernels registered under "auto" may support.
        o = attention(q, k, v, impl="xla").reshape(b, t, h, w, c)
        return x + self.proj(o).astype(x.dtype), cache


class Resample(nnx.Module):
    """2x spatial up/downsampling per frame, optionally 2x in time through a causal `time_conv`.

    Args:
      dim: input channels.
      mode: "upsample2d", "upsample3d", "downsample2d" or "downsample3d".
      out_dim: output channels of an upsample (None: dim // 2, diffusers' default
        `upsample_out_dim`; Wan 2.2's residual decoder keeps dim). Downsamples keep dim.
    """

    MODES = ("upsample2d", "upsample3d", "downsample2d", "downsample3d")
    time_conv: CausalConv3d | None

    def __init__(
        self,
        dim: int,
        mode: str,
        *,
        out_dim: int | None = None,
        dtype,
        param_dtype,
        conv_impl: str,
        rngs: nnx.Rngs,
    ):
        if mode not in self.MODES:
            raise ValueError(f"unknown resample mode {mode!r}; choose from {self.MODES}")
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mode = mode
        if mode.startswith("up"):
            out = dim // 2 if out_dim is None else out_dim
            self.conv = Conv2d(dim, out, 3, padding=((1, 1), (1, 1)), **kw)
        else:
            # torch ZeroPad2d((0, 1, 0, 1)): one row/column of zeros at the bottom/right.
            self.conv = Conv2d(dim, dim, 3, stride=2, padding=((0, 1), (0, 1)), **kw)
        if mode == "upsample3d":
            # Each half of the output channels becomes one of two consecutive frames.
            self.time_conv = CausalConv3d(dim, 2 * dim, (3, 1, 1), conv_impl=conv_impl, **kw)
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(
                dim, dim, (3, 1, 1), stride_t=2, conv_impl=conv_impl, **kw
            )
        else:
            self.time_conv = None

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        if self.mode == "upsample3d":
            assert self.time_conv is not None  # built for the 3d modes
            if cache is None:
                # First chunk: its single frame stays single, and the time conv of the next
                # chunk sees zeros rather than this frame (diffusers' "Rep").
                cache = jnp.zeros((x.shape[0], 2, *x.shape[2:]), self.time_conv.dtype)
            else:
                y, cache = self.time_conv(x, cache)
                b, t, h, w, c2 = y.shape
                y = y.reshape(b, t, h, w, 2, c2 // 2).transpose(0, 1, 4, 2, 3, 5)
                x = y.reshape(b, 2 * t, h, w, c2 // 2)
        if self.mode.startswith("up"):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)
        x = self.conv(x)
        if self.mode == "downsample3d":
            assert self.time_conv is not None  # built for the 3d modes
            last = x[:, -1:]
            if cache is not None:
                # Valid stride-2 conv over [last frame of the previous chunk, this chunk]; the
                # first chunk is only cached, so frame 0 maps to latent frame 0 on its own.
                x = self.time_conv.conv(jnp.concatenate([cache, x], axis=1))
            cache = last
        return x, cache


class MidBlock(nnx.Module):
    """Residual block, attention, residual block at the lowest resolution."""

    def __init__(self, dim: int, *, dtype, param_dtype, conv_impl: str, rngs: nnx.Rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        res: dict[str, Any] = dict(kw, conv_impl=conv_impl)
        self.resnets = nnx.List([ResidualBlock(dim, dim, **res), ResidualBlock(dim, dim, **res)])
        self.attentions = nnx.List([AttentionBlock(dim, **kw)])

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        c0, c1 = (None, None) if cache is None else cache
        x, c0 = self.resnets[0](x, c0)
        x, _ = self.attentions[0](x)
        x, c1 = self.resnets[1](x, c1)
        return x, (c0, c1)


def encoder_layout(config: WanVAEConfig) -> list[tuple]:
    """Wan 2.1's encoder `down_blocks`, in order, as ("res", in, out) | ("attn", c) | (mode, c).

    (Wan 2.2's residual encoder has one `DownBlock` per `config.encoder_stages` entry instead.)
    """
    layers: list[tuple] = []
    for i, (in_dim, out_dim, mode) in enumerate(config.encoder_stages):
        for _ in range(config.num_res_blocks):
            layers.append(("res", in_dim, out_dim))
            if config.encoder_scales[i] in config.attn_scales:
                layers.append(("attn", out_dim))
            in_dim = out_dim
        if mode is not None:
            layers.append((mode, out_dim))
    return layers


def patchify(x: Float[Array, "b t h w c"], p: int | None) -> Float[Array, "b t h2 w2 c2"]:
    """Folds p x p pixel patches into channels, (b, t, h, w, c) -> (b, t, h / p, w / p, c * p * p),
    in diffusers' order: channel c * p * p + j * p + i holds the pixel at row i, column j of a
    patch (unlike the DiT patchify, the column varies slower). p None or 1: x unchanged."""
    if p is None or p == 1:
        return x
    b, t, h, w, c = x.shape
    x = x.reshape(b, t, h // p, p, w // p, p, c)
    return x.transpose(0, 1, 2, 4, 6, 5, 3).reshape(b, t, h // p, w // p, c * p * p)


def unpatchify(x: Float[Array, "b t h w c"], p: int | None) -> Float[Array, "b t h2 w2 c2"]:
    """The inverse of `patchify`: (b, t, h, w, c * p * p) -> (b, t, h * p, w * p, c)."""
    if p is None or p == 1:
        return x
    b, t, h, w, cp = x.shape
    x = x.reshape(b, t, h, w, cp // (p * p), p, p)
    return x.transpose(0, 1, 2, 6, 3, 5, 4).reshape(b, t, h * p, w * p, cp // (p * p))


def avg_down(
    x: Float[Array, "b t h w c"], out_dim: int, factor_t: int, factor_s: int
) -> Float[Array, "b t2 h2 w2 c2"]:
    """Wan 2.2's down shortcut (diffusers `AvgDown3D`): space-to-depth by (factor_t, factor_s,
    factor_s), then the mean of each group of consecutive channels, down to `out_dim`.

    A chunk whose length is not a multiple of factor_t (the first frame) gets zero frames in
    front, as in diffusers.
    """
    b, t, h, w, c = x.shape
    pad = -t % factor_t
    if pad:
        x = jnp.pad(x, ((0, 0), (pad, 0), (0, 0), (0, 0), (0, 0)))
        t += pad
    ft, fs = factor_t, factor_s
    x = x.reshape(b, t // ft, ft, h // fs, fs, w // fs, fs, c)
    # Channels in diffusers' order: c, then the offsets in time, height, width.
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6)
    x = x.reshape(b, t // ft, h // fs, w // fs, out_dim, c * ft * fs * fs // out_dim)
    return jnp.mean(x, axis=-1)


def dup_up(
    x: Float[Array, "b t h w c"], out_dim: int, factor_t: int, factor_s: int, *, first: bool
) -> Float[Array, "b t2 h2 w2 c2"]:
    """Wan 2.2's up shortcut (diffusers `DupUp3D`): each channel repeated, then depth-to-space
    by (factor_t, factor_s, factor_s), the inverse arrangement of `avg_down`.

    Args:
      first: the clip's first chunk, whose frame upsamples to one frame (the last of the
        factor_t), as the temporal upsample of the main path keeps it single.
    """
    b, t, h, w, c = x.shape
    ft, fs = factor_t, factor_s
    x = jnp.repeat(x, out_dim * ft * fs * fs // c, axis=-1)
    x = x.reshape(b, t, h, w, out_dim, ft, fs, fs).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, t * ft, h * fs, w * fs, out_dim)
    return x[:, ft - 1 :] if first else x


def _kw(config: WanVAEConfig, rngs: nnx.Rngs) -> dict:
    """The dtypes, conv implementation and rngs every conv layer takes from the config."""
    return dict(
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        conv_impl=config.conv_impl,
        rngs=rngs,
    )


class DownBlock(nnx.Module):
    """Wan 2.2's encoder stage: `num` residual blocks and an optional `Resample` downsample,
    plus the stage's input averaged down to the output's shape (`avg_down`)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        num: int,
        mode: str | None,
        *,
        dtype,
        param_dtype,
        conv_impl: str,
        rngs,
    ):
        kw: dict[str, Any] = dict(
            dtype=dtype, param_dtype=param_dtype, conv_impl=conv_impl, rngs=rngs
        )
        self.resnets = nnx.List(
            [ResidualBlock(in_dim if j == 0 else out_dim, out_dim, **kw) for j in range(num)]
        )
        self.downsampler = Resample(out_dim, mode, **kw) if mode else None
        self.shortcut = (out_dim, 2 if mode == "downsample3d" else 1, 2 if mode else 1)

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        y, cache = stream_stage(self.resnets, self.downsampler, x, cache)
        return y + avg_down(x, *self.shortcut).astype(y.dtype), cache


class Encoder(nnx.Module):
    """Pixels (b, t, H, W, c_in) -> latent moments (b, t', H/s, W/s, 2 z)."""

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs):
        conv = _kw(config, rngs)
        kw = {k: v for k, v in conv.items() if k != "conv_impl"}
        dims = config.encoder_dims
        self.patch_size = config.patch_size
        self.conv_in = CausalConv3d(config.in_channels, dims[0], **conv)
        layers: list[nnx.Module] = []
        if config.is_residual:
            for in_dim, out_dim, mode in config.encoder_stages:
                layers.append(DownBlock(in_dim, out_dim, config.num_res_blocks, mode, **conv))
        else:
            for kind, *sizes in encoder_layout(config):
                if kind == "res":
                    layers.append(ResidualBlock(*sizes, **conv))
                elif kind == "attn":
                    layers.append(AttentionBlock(*sizes, **kw))
                else:
                    (dim,) = sizes
                    layers.append(Resample(dim, kind, **conv))
        self.down_blocks = nnx.List(layers)
        self.mid_block = MidBlock(dims[-1], **conv)
        self.norm_out = ChannelRMSNorm(dims[-1], param_dtype=kw["param_dtype"])
        self.conv_out = CausalConv3d(dims[-1], 2 * config.z_dim, **conv)

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        c_in, c_layers, c_mid, c_out = (None, None, None, None) if cache is None else cache
        x, c_in = self.conv_in(patchify(x, self.patch_size), c_in)
        x, c_layers = stream_through(self.down_blocks, x, c_layers)
        x, c_mid = self.mid_block(x, c_mid)
        x, c_out = self.conv_out(jax.nn.silu(self.norm_out(x)), c_out)
        return x, (c_in, c_layers, c_mid, c_out)


class UpBlock(nnx.Module):
    """`num` residual blocks, then an optional `Resample` upsample.

    With `residual` (Wan 2.2) the upsample keeps its channels and an upsampling stage adds its
    input repeated up to the output's shape (`dup_up`).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        num: int,
        mode: str | None,
        *,
        residual: bool = False,
        dtype,
        param_dtype,
        conv_impl: str,
        rngs,
    ):
        kw: dict[str, Any] = dict(
            dtype=dtype, param_dtype=param_dtype, conv_impl=conv_impl, rngs=rngs
        )
        self.resnets = nnx.List(
            [ResidualBlock(in_dim if j == 0 else out_dim, out_dim, **kw) for j in range(num)]
        )
        up_dim = out_dim if residual else None
        self.upsampler = Resample(out_dim, mode, out_dim=up_dim, **kw) if mode else None
        self.shortcut = (
            (out_dim, 2 if mode == "upsample3d" else 1, 2) if residual and mode else None
        )

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        y, new_cache = stream_stage(self.resnets, self.upsampler, x, cache)
        if self.shortcut is not None:
            y = y + dup_up(x, *self.shortcut, first=cache is None).astype(y.dtype)
        return y, new_cache


class Decoder(nnx.Module):
    """Latents (b, t, h, w, z) -> pixels (b, t', h*s, w*s, c_out), unclamped."""

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs):
        kw = _kw(config, rngs)
        dims = config.decoder_dims
        self.patch_size = config.patch_size
        self.conv_in = CausalConv3d(config.z_dim, dims[0], **kw)
        self.mid_block = MidBlock(dims[0], **kw)
        self.up_blocks = nnx.List(
            [
                UpBlock(i, o, config.num_res_blocks + 1, mode, residual=config.is_residual, **kw)
                for i, o, mode in config.decoder_layout
            ]
        )
        self.norm_out = ChannelRMSNorm(dims[-1], param_dtype=kw["param_dtype"])
        self.conv_out = CausalConv3d(dims[-1], config.out_channels, **kw)

    def __call__(self, x: Float[Array, "b t h w c"], cache: Cache) -> tuple[Array, Cache]:
        c_in, c_mid, c_ups, c_out = (None, None, None, None) if cache is None else cache
        x, c_in = self.conv_in(x, c_in)
        x, c_mid = self.mid_block(x, c_mid)
        x, c_ups = stream_through(self.up_blocks, x, c_ups)
        x, c_out = self.conv_out(jax.nn.silu(self.norm_out(x)), c_out)
        return unpatchify(x, self.patch_size), (c_in, c_mid, c_ups, c_out)


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _tiled(
    fn: Callable[[Array], Array],
    x: Float[Array, "b t h w c"],
    *,
    tile_in: tuple[int, int],
    stride_in: tuple[int, int],
    scale: float,
) -> Array:
    """Runs fn on overlapping spatial tiles of x and cross-fades their outputs (diffusers' scheme).

    Output tiles are blended over (tile - stride) rows/columns with their upper and left
    neighbours (already blended, as diffusers blends in place), cropped to the stride and joined.
    """
    tile_out = (round(tile_in[0] * scale), round(tile_in[1] * scale))
    stride_out = (round(stride_in[0] * scale), round(stride_in[1] * scale))
    rows: list[list[Array]] = []
    for i in range(0, x.shape[2], stride_in[0]):
        row: list[Array] = []
        for j in range(0, x.shape[3], stride_in[1]):
            tile = fn(x[:, :, i : i + tile_in[0], j : j + tile_in[1]])
            if rows:
                tile = cross_fade(rows[-1][len(row)], tile, tile_out[0] - stride_out[0], axis=2)
            if row:
                tile = cross_fade(row[-1], tile, tile_out[1] - stride_out[1], axis=3)
            row.append(tile)
        rows.append(row)
    out = jnp.concatenate(
        [
            jnp.concatenate([t[:, :, : stride_out[0], : stride_out[1]] for t in row], axis=3)
            for row in rows
        ],
        axis=2,
    )
    return out[:, :, : round(x.shape[2] * scale), : round(x.shape[3] * scale)]


class WanVAE(VideoVAE):
    """The Wan 2.1 / 2.2 VAE: causal 3D conv encoder/decoder with a diagonal Gaussian latent.

    `encode`/`decode` are the jit-compiled user API on normalised latents; `moments` and
    `decode_raw` are the traceable pieces (for training inside your own transforms).
    """

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs):
        self.config = config
        kw = _kw(config, rngs)
        z = config.z_dim
        self.encoder = Encoder(config, rngs=rngs)
        self.quant_conv = CausalConv3d(2 * z, 2 * z, (1, 1, 1), **kw)
        self.post_quant_conv = CausalConv3d(z, z, (1, 1, 1), **kw)
        self.decoder = Decoder(config, rngs=rngs)

    # ---------------------------------------------------------------- checks and normalisation

    def _check_video(self, x) -> None:
        # The encoder runs ENCODE_CHUNK-frame chunks whatever the temporal factor.
        cfg = self.config
        check_video(
            x,
            channels=cfg.video_in_channels,
            temporal_factor=ENCODE_CHUNK,
            spatial_factor=cfg.spatial_factor,
        )

    def _stats(self) -> tuple[Array, Array]:
        cfg = self.config
        mean = cfg.latents_mean or (0.0,) * cfg.z_dim
        std = cfg.latents_std or (1.0,) * cfg.z_dim
        return jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)

    def normalize(self, z: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c"]:
        """Raw latents -> (z - latents_mean) / latents_std (what the diffusion model sees)."""
        mean, std = (last_axis(v, z.ndim) for v in self._stats())
        return ((z.astype(jnp.float32) - mean) / std).astype(z.dtype)

    def denormalize(self, z: Float[Array, "b t h w c"]) -> Float[Array, "b t h w c"]:
        """Normalised latents -> raw latents z * latents_std + latents_mean."""
        mean, std = (last_axis(v, z.ndim) for v in self._stats())
        return (z.astype(jnp.float32) * std + mean).astype(z.dtype)

    # ---------------------------------------------------------------- traceable pieces

    def moments(
        self, x: Float[Array, "b T H W c"], *, frames_per_step: int = ENCODE_CHUNK
    ) -> tuple[Float[Array, "b t h w z"], Float[Array, "b t h w z"]]:
        """Raw posterior mean and log-variance of a video.

        Args:
          x: pixels in [-1, 1], T = 1 + 4k frames, H and W divisible by the spatial factor.
          frames_per_step: frames per scan step after frame 0 (a multiple of 4 dividing T - 1);
            the result does not depend on it, only memory and speed do.

        Returns:
          (mu, logvar), each (b, 1 + (T - 1) / temporal_factor, H / s, W / s, z_dim);
          logvar clipped to [-30, 20] as diffusers does.
        """
        self._check_video(x)
        if frames_per_step % ENCODE_CHUNK or (x.shape[1] - 1) % frames_per_step:
            raise ValueError(
                f"frames_per_step={frames_per_step} must be a multiple of {ENCODE_CHUNK} "
                f"dividing {x.shape[1] - 1}"
            )
        x = shard(x.astype(jnp.dtype(self.config.dtype)), VIDEO_AXES)
        h = run_chunked(self.encoder, x, frames_per_step)
        h, _ = self.quant_conv(h)
        mu, logvar = jnp.split(h, 2, axis=-1)
        return mu, jnp.clip(logvar, -30.0, 20.0)

    def decode_raw(
        self, z: Float[Array, "b t h w z"], *, latents_per_step: int = 1
    ) -> Float[Array, "b T H W c"]:
        """Raw (un-normalised) latents -> pixels, unclamped.

        Args:
          z: raw latents.
          latents_per_step: latent frames per scan step after frame 0 (must divide t - 1);
            the result does not depend on it, only memory and speed do.

        Returns:
          Pixels (b, 1 + (t - 1) * temporal_factor, h * s, w * s, video_out_channels).
        """
        self._check_latents(z)
        if latents_per_step < 1 or (z.shape[1] - 1) % latents_per_step:
            raise ValueError(
                f"latents_per_step={latents_per_step} must be positive and divide {z.shape[1] - 1}"
            )
        z = shard(z.astype(jnp.dtype(self.config.dtype)), VIDEO_AXES)
        x, _ = self.post_quant_conv(z)
        return run_chunked(self.decoder, x, latents_per_step)

    # ---------------------------------------------------------------- user API

    def encode(
        self,
        x: Float[Array, "b T H W c"],
        *,
        tile_size: int | tuple[int, int] | None = None,
        tile_stride: int | tuple[int, int] | None = None,
        frames_per_step: int = ENCODE_CHUNK,
    ) -> Float[Array, "b t h w z"]:
        """Normalised posterior mode (mu - latents_mean) / latents_std of a video in [-1, 1].

        Args:
          x: (b, T, H, W, c) with T = 1 + 4k and H, W divisible by the spatial factor.
          tile_size / tile_stride: optional pixel tiles (multiples of the spatial factor) for
            frames larger than `tile_size`; overlapping moments are cross-faded as in diffusers.
          frames_per_step: see `moments`.

        Returns:
          (b, 1 + (T - 1) / temporal_factor, H / s, W / s, z_dim).
        """
        self._check_video(x)
        tiles = self._tiles(tile_size, tile_stride, x.shape[2:4], 1)
        if tiles is None:
            return _encode_jit(self, x, frames_per_step)
        h = _tiled(
            lambda t: _moments_jit(self, t, frames_per_step),
            x,
            tile_in=tiles[0],
            stride_in=tiles[1],
            scale=1 / self.config.spatial_factor,
        )
        return self.normalize(h[..., : self.config.z_dim])

    def decode(
        self,
        z: Float[Array, "b t h w z"],
        *,
        tile_size: int | tuple[int, int] | None = None,
        tile_stride: int | tuple[int, int] | None = None,
        latents_per_step: int = 1,
    ) -> Float[Array, "b T H W c"]:
        """Normalised latents -> pixels clamped to [-1, 1], one latent frame per scan step.

        Args:
          z: (b, t, h, w, z_dim) normalised latents (as `encode` returns).
          tile_size / tile_stride: optional pixel tiles (multiples of the spatial factor) for
            frames larger than `tile_size`; overlaps are cross-faded as in diffusers.
          latents_per_step: see `decode_raw`.

        Returns:
          (b, 1 + (t - 1) * temporal_factor, h * s, w * s, video_out_channels).
        """
        self._check_latents(z)
        tiles = self._tiles(tile_size, tile_stride, z.shape[2:4], self.config.spatial_factor)
        if tiles is None:
            return _decode_jit(self, z, latents_per_step)
        s, p = self.config.spatial_factor, self.config.patch_size or 1
        # Tiles are cross-faded as patches (each tile's pixels folded back), as diffusers blends
        # the decoder's output before unpatchifying.
        x = _tiled(
            lambda t: patchify(_decode_raw_jit(self, t, latents_per_step), p),
            self.denormalize(z),
            tile_in=(tiles[0][0] // s, tiles[0][1] // s),
            stride_in=(tiles[1][0] // s, tiles[1][1] // s),
            scale=s // p,
        )
        return jnp.clip(unpatchify(x, p), -1.0, 1.0)

    def _tiles(self, tile_size, tile_stride, hw, pixels_per_unit):
        """Validated ((tile_h, tile_w), (stride_h, stride_w)) in pixels, or None if untiled."""
        if tile_size is None:
            if tile_stride is not None:
                raise ValueError("tile_stride given without tile_size")
            return None
        s = self.config.spatial_factor
        size = _pair(tile_size)
        stride = (
            _pair(tile_stride)
            if tile_stride is not None
            else tuple(max(s, (3 * v // 4) // s * s) for v in size)
        )
        for name, v in (("tile_size", size), ("tile_stride", stride)):
            if min(v) < s or v[0] % s or v[1] % s:
                raise ValueError(f"{name} {v} must be positive multiples of {s}")
        if stride[0] > size[0] or stride[1] > size[1]:
            raise ValueError(f"tile_stride {stride} exceeds tile_size {size}")
        pixels = (hw[0] * pixels_per_unit, hw[1] * pixels_per_unit)
        if pixels[0] <= size[0] and pixels[1] <= size[1]:
            return None
        return size, stride


@nnx.jit(static_argnames=("frames_per_step",))
def _encode_jit(vae: WanVAE, x, frames_per_step):
    return vae.normalize(vae.moments(x, frames_per_step=frames_per_step)[0])


@nnx.jit(static_argnames=("frames_per_step",))
def _moments_jit(vae: WanVAE, x, frames_per_step):
    return jnp.concatenate(vae.moments(x, frames_per_step=frames_per_step), axis=-1)


@nnx.jit(static_argnames=("latents_per_step",))
def _decode_jit(vae: WanVAE, z, latents_per_step):
    x = vae.decode_raw(vae.denormalize(z), latents_per_step=latents_per_step)
    return jnp.clip(x, -1.0, 1.0)


@nnx.jit(static_argnames=("latents_per_step",))
def _decode_raw_jit(vae: WanVAE, z, latents_per_step):
    return vae.decode_raw(z, latents_per_step=latents_per_step)
