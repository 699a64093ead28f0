"""The HunyuanVideo (1.0) diffusion transformer in Flax NNX.

The forward pass is split into reusable stages, as for Wan:

    tokens, grid = model.embed(x)                                   # patchify
    cond = model.condition(timestep, text, text_mask, pooled, guidance)
    angles = model.rope(grid, positions)                            # (l, k/2)
    tokens = model.run_blocks(tokens, cond, angles)                 # dual- then single-stream
    x = model.unembed(tokens, cond, grid)                           # modulated head, unpatchify

`model(x, timestep, text, text_mask, pooled, guidance)` chains them. Each stack of identical
blocks is created with a leading "layers" axis and run under one `jax.lax.scan`.

The pieces HunyuanVideo-1.5 shares (dual-stream block, token refiner, embedders, patchify and
the output head, as `DualStreamDiT`) live here and are imported by `vidax.models.hunyuan15`.

Text masks: a False entry is a padded text token. It is never attended to as a key, so its
values cannot reach the video tokens; what the model computes *at* padded text positions is
unspecified (diffusers computes something different there, and it is discarded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Bool, Float

from vidax.models.dit_stages import MLPEmbedder, VideoDiT
from vidax.models.hunyuan.config import HunyuanVideoConfig
from vidax.nn import LayerNorm, Linear, RMSNorm, apply_rope, attention
from vidax.nn.embeddings import timestep_embedding
from vidax.nn.layers import FeedForward, gelu_tanh, layer_norm, modulate
from vidax.nn.scan import scan_layers, stack_layers
from vidax.sharding import shard

# (q, k, v) each (b, l+s, n, k) over [video; text] tokens, key_mask (b, l+s) bool -> (b, l+s, n, k).
# Replaces the joint attention of every dual- and single-stream block (e.g. block-sparse).
JointAttentionFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]

_VIDEO = ("batch", "tokens", "embed")
_TEXT = ("batch", "text_tokens", "embed")


@dataclasses.dataclass(frozen=True)
class Conditioning:
    """Per-call conditioning shared by all blocks.

    temb: (b, d) float32 vector conditioning (timestep [+ guidance] + pooled text); every block
    derives its adaLN modulation from it. text: (b, s, d) refined text tokens. text_mask: (b, s)
    bool, True for real (attended) text tokens.
    """

    temb: jax.Array
    text: jax.Array
    text_mask: jax.Array


jax.tree_util.register_dataclass(
    Conditioning, data_fields=["temb", "text", "text_mask"], meta_fields=[]
)


# -- building blocks ---------------------------------------------------------------------------


def _heads(x: Float[Array, "b l d"], num_heads: int) -> Float[Array, "b l n k"]:
    return rearrange(x, "b l (n k) -> b l n k", n=num_heads)


def _flat(x: Float[Array, "b l n k"]) -> Float[Array, "b l d"]:
    return rearrange(x, "b l n k -> b l (n k)")


def _rope_prefix(x: Float[Array, "b l n k"], angles, num_video: int) -> Float[Array, "b l n k"]:
    """RoPE on the first `num_video` (video) tokens; text tokens carry no position."""
    if angles is None:
        return x
    if num_video == x.shape[1]:
        return apply_rope(x, angles)
    return jnp.concatenate([apply_rope(x[:, :num_video], angles), x[:, num_video:]], axis=1)


def joint_attention(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b l n k"],
    v: Float[Array, "b l n k"],
    key_mask: Bool[Array, "b l"],
    *,
    impl: str,
    attention_fn: JointAttentionFn | None = None,
) -> Float[Array, "b l n k"]:
    """Attention over [video; text] tokens; keys where `key_mask` is False are ignored."""
    q = shard(q, ("batch", "attn_tokens", "attn_heads", "head_dim"))
    k = shard(k, ("batch", "kv_tokens", "attn_heads", "head_dim"))
    v = shard(v, ("batch", "kv_tokens", "attn_heads", "head_dim"))
    if attention_fn is not None:
        out = attention_fn(q, k, v, key_mask)
    else:
        out = attention(q, k, v, mask=key_mask[:, None, None, :], impl=impl)
    # Pin the output like the queries so Ulysses reshards heads back to tokens here.
    return shard(out, ("batch", "attn_tokens", "attn_heads", "head_dim"))


def _chunks(mod: Float[Array, "b m"], parts: int) -> list[jax.Array]:
    """(b, parts*d) modulation -> `parts` arrays (b, 1, d) broadcasting over tokens."""
    m = mod.reshape(mod.shape[0], parts, 1, -1)
    return [m[:, i] for i in range(parts)]


def _gated(x: jax.Array, y: jax.Array, gate: jax.Array) -> jax.Array:
    """x + y * gate in float32, returned in x's dtype (the gated residual)."""
    return (x.astype(jnp.float32) + y.astype(jnp.float32) * gate).astype(x.dtype)


class DualAttention(nnx.Module):
    """Projections of the dual-stream joint attention: video (to_*) and text (add_*) weights,
    per-head RMSNorm on q and k of both streams."""

    # Set in a loop in __init__ (checkpoint order fixes the random initialisation).
    to_q: Linear
    to_k: Linear
    to_v: Linear
    add_q_proj: Linear
    add_k_proj: Linear
    add_v_proj: Linear
    norm_q: RMSNorm
    norm_k: RMSNorm
    norm_added_q: RMSNorm
    norm_added_k: RMSNorm

    def __init__(self, dim: int, num_heads: int, *, eps: float, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        head_dim = dim // num_heads
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
            setattr(self, name, Linear(dim, dim, axes=("embed", "heads"), **kw))
        self.to_out = Linear(dim, dim, axes=("heads", "embed"), **kw)
        self.to_add_out = Linear(dim, dim, axes=("heads", "embed"), **kw)
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            setattr(self, name, RMSNorm(head_dim, eps=eps, param_dtype=param_dtype))
        self.num_heads = num_heads

    def qkv(self, x: Float[Array, "b l d"], *, context: bool):
        """q, k, v (b, l, n, k) of one stream (`context`: the text stream's weights)."""
        n = self.num_heads
        if context:
            q = self.norm_added_q(_heads(self.add_q_proj(x), n))
            k = self.norm_added_k(_heads(self.add_k_proj(x), n))
            return q, k, _heads(self.add_v_proj(x), n)
        q = self.norm_q(_heads(self.to_q(x), n))
        k = self.norm_k(_heads(self.to_k(x), n))
        return q, k, _heads(self.to_v(x), n)


class _Block(nnx.Module):
    """The constructor the HunyuanVideo blocks share; each builds its own layers in `_layers`
    (in checkpoint order, which fixes the random initialisation)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_dim: int,
        *,
        eps: float,
        attention_impl: str,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self._layers(
            dim, num_heads, mlp_dim, eps, dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        )
        self.num_heads = num_heads
        self.eps = eps
        self.attention_impl = attention_impl

    def _layers(self, dim: int, num_heads: int, mlp_dim: int, eps: float, kw: dict) -> None:
        raise NotImplementedError


def _stack(block: type[_Block], num_layers: int, *args, rngs: nnx.Rngs, **kwargs) -> _Block:
    """`num_layers` blocks stacked on a leading "layers" axis (see `stack_layers`)."""
    return stack_layers(num_layers, lambda r: block(*args, **kwargs, rngs=r), rngs)


class DualStreamBlock(_Block):
    """MM-DiT block: separate adaLN-zero modulation, projections and FFNs for video and text,
    one joint attention over [video; text] (RoPE on video only)."""

    def _layers(self, dim: int, num_heads: int, mlp_dim: int, eps: float, kw: dict) -> None:
        f32 = {**kw, "dtype": jnp.float32}  # modulation is computed in float32
        self.modulation = Linear(dim, 6 * dim, axes=("embed", "modulation"), **f32)
        self.modulation_context = Linear(dim, 6 * dim, axes=("embed", "modulation"), **f32)
        self.attn = DualAttention(dim, num_heads, eps=eps, **kw)
        self.ff = FeedForward(dim, mlp_dim, activation=gelu_tanh, **kw)
        self.ff_context = FeedForward(dim, mlp_dim, activation=gelu_tanh, **kw)

    def __call__(
        self,
        x: Float[Array, "b l d"],
        context: Float[Array, "b s d"],
        temb: Float[Array, "b d"],
        angles: Float[Array, "l k/2"] | None,
        key_mask: Bool[Array, "b l+s"],
        *,
        attention_fn: JointAttentionFn | None = None,
    ) -> tuple[Float[Array, "b l d"], Float[Array, "b s d"]]:
        act = jax.nn.silu(temb)
        shift, scale, gate, ff_shift, ff_scale, ff_gate = _chunks(self.modulation(act), 6)
        c_shift, c_scale, c_gate, c_ff_shift, c_ff_scale, c_ff_gate = _chunks(
            self.modulation_context(act), 6
        )
        num_video, dtype = x.shape[1], x.dtype

        h = modulate(layer_norm(x, self.eps), shift, scale).astype(dtype)
        hc = modulate(layer_norm(context, self.eps), c_shift, c_scale).astype(dtype)
        q, k, v = self.attn.qkv(h, context=False)
        cq, ck, cv = self.attn.qkv(hc, context=True)
        q, k = _rope_prefix(q, angles, num_video), _rope_prefix(k, angles, num_video)
        o = joint_attention(
            jnp.concatenate([q, cq], axis=1),
            jnp.concatenate([k, ck], axis=1),
            jnp.concatenate([v, cv], axis=1),
            key_mask,
            impl=self.attention_impl,
            attention_fn=attention_fn,
        )
        x = _gated(x, self.attn.to_out(_flat(o[:, :num_video])), gate)
        context = _gated(context, self.attn.to_add_out(_flat(o[:, num_video:])), c_gate)

        h = modulate(layer_norm(x, self.eps), ff_shift, ff_scale).astype(dtype)
        hc = modulate(layer_norm(context, self.eps), c_ff_shift, c_ff_scale).astype(dtype)
        x = _gated(x, self.ff(h), ff_gate)
        context = _gated(context, self.ff_context(hc), c_ff_gate)
        return shard(x, _VIDEO), shard(context, _TEXT)


class SingleStreamBlock(_Block):
    """One weight set over the concatenated [video; text] tokens: adaLN-zero, then attention and
    a GELU-tanh MLP in parallel whose outputs share one output projection."""

    # Set in a loop in _layers (checkpoint order fixes the random initialisation).
    to_q: Linear
    to_k: Linear
    to_v: Linear

    def _layers(self, dim: int, num_heads: int, mlp_dim: int, eps: float, kw: dict) -> None:
        param_dtype = kw["param_dtype"]
        f32 = {**kw, "dtype": jnp.float32}  # modulation is computed in float32
        self.modulation = Linear(dim, 3 * dim, axes=("embed", "modulation"), **f32)
        for name in ("to_q", "to_k", "to_v"):
            setattr(self, name, Linear(dim, dim, axes=("embed", "heads"), **kw))
        self.norm_q = RMSNorm(dim // num_heads, eps=eps, param_dtype=param_dtype)
        self.norm_k = RMSNorm(dim // num_heads, eps=eps, param_dtype=param_dtype)
        self.proj_mlp = Linear(dim, mlp_dim, axes=("embed", "mlp"), **kw)
        # The input is [attention output (heads); MLP hidden (mlp)]: annotated as "mlp", the
        # larger part, so tensor parallelism splits the contraction.
        self.proj_out = Linear(dim + mlp_dim, dim, axes=("mlp", "embed"), **kw)

    def __call__(
        self,
        x: Float[Array, "b l+s d"],
        temb: Float[Array, "b d"],
        angles: Float[Array, "l k/2"] | None,
        key_mask: Bool[Array, "b l+s"],
        *,
        num_video: int,
        attention_fn: JointAttentionFn | None = None,
    ) -> Float[Array, "b l+s d"]:
        shift, scale, gate = _chunks(self.modulation(jax.nn.silu(temb)), 3)
        h = modulate(layer_norm(x, self.eps), shift, scale).astype(x.dtype)
        mlp = gelu_tanh(self.proj_mlp(h))
        n = self.num_heads
        q = _rope_prefix(self.norm_q(_heads(self.to_q(h), n)), angles, num_video)
        k = _rope_prefix(self.norm_k(_heads(self.to_k(h), n)), angles, num_video)
        v = _heads(self.to_v(h), n)
        o = joint_attention(q, k, v, key_mask, impl=self.attention_impl, attention_fn=attention_fn)
        out = self.proj_out(jnp.concatenate([_flat(o), mlp.astype(o.dtype)], axis=-1))
        return shard(_gated(x, out, gate), _VIDEO)


class RefinerBlock(_Block):
    """Token refiner block: x += g1 * Attn(LN x); x += g2 * FFN_silu(LN x), gates from temb."""

    # Set in a loop in _layers (checkpoint order fixes the random initialisation).
    to_q: Linear
    to_k: Linear
    to_v: Linear

    def _layers(self, dim: int, num_heads: int, mlp_dim: int, eps: float, kw: dict) -> None:
        param_dtype = kw["param_dtype"]
        self.norm1 = LayerNorm(dim, eps=eps, param_dtype=param_dtype)
        for name in ("to_q", "to_k", "to_v"):
            setattr(self, name, Linear(dim, dim, axes=("embed", "heads"), **kw))
        self.to_out = Linear(dim, dim, axes=("heads", "embed"), **kw)
        self.norm2 = LayerNorm(dim, eps=eps, param_dtype=param_dtype)
        self.ff = FeedForward(dim, mlp_dim, activation=jax.nn.silu, **kw)
        self.gates = Linear(
            dim, 2 * dim, axes=("embed", "modulation"), **{**kw, "dtype": jnp.float32}
        )

    def __call__(
        self, x: Float[Array, "b s d"], temb: Float[Array, "b d"], key_mask: Bool[Array, "b s"]
    ) -> Float[Array, "b s d"]:
        gate_attn, gate_ff = _chunks(self.gates(jax.nn.silu(temb)), 2)
        h = self.norm1(x)
        n = self.num_heads
        q, k, v = (_heads(proj(h), n) for proj in (self.to_q, self.to_k, self.to_v))
        o = attention(q, k, v, mask=key_mask[:, None, None, :], impl=self.attention_impl)
        x = _gated(x, self.to_out(_flat(o)), gate_attn)
        x = _gated(x, self.ff(self.norm2(x)), gate_ff)
        return shard(x, _TEXT)


class TokenRefiner(nnx.Module):
    """Text token refiner: conditions on timestep + masked-mean-pooled text, projects the text
    embeddings to the model width and runs a few self-attention blocks over them."""

    def __init__(
        self,
        text_dim: int,
        dim: int,
        num_heads: int,
        mlp_dim: int,
        num_layers: int,
        *,
        freq_dim: int,
        eps: float,
        attention_impl: str,
        remat: bool = False,
        dtype,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        f32 = {**kw, "dtype": jnp.float32}
        self.time_embedder = MLPEmbedder(freq_dim, dim, in_axis="freq", **f32)
        self.pooled_embedder = MLPEmbedder(text_dim, dim, in_axis="text_embed", **f32)
        self.proj_in = Linear(text_dim, dim, axes=("text_embed", "embed"), **kw)
        self.blocks = _stack(
            RefinerBlock,
            num_layers,
            dim,
            num_heads,
            mlp_dim,
            eps=eps,
            attention_impl=attention_impl,
            **kw,
        )
        self.freq_dim = freq_dim
        self.remat = remat

    def __call__(
        self,
        text: Float[Array, "b s e"],
        timestep: Float[Array, " b"],
        mask: Bool[Array, "b s"],
        *,
        key_mask: Bool[Array, "b s"] | None = None,
    ) -> Float[Array, "b s d"]:
        """Refined text (b, s, d). `mask` selects the pooled tokens; `key_mask` (default: `mask`)
        the tokens attended to."""
        weights = mask.astype(jnp.float32)[..., None]
        # Masked mean; a fully padded row pools to zero instead of 0/0.
        pooled = jnp.sum(text.astype(jnp.float32) * weights, axis=1) / jnp.maximum(
            jnp.sum(weights, axis=1), 1.0
        )
        temb = self.time_embedder(timestep_embedding(timestep, self.freq_dim))
        temb = temb + self.pooled_embedder(pooled)
        x = shard(self.proj_in(text), _TEXT)
        key_mask = mask if key_mask is None else key_mask
        return scan_layers(
            self.blocks, x, lambda block, x: block(x, temb, key_mask), remat=self.remat
        )


# -- the model ---------------------------------------------------------------------------------


class DualStreamDiT(VideoDiT):
    """Stages shared by HunyuanVideo 1 and 1.5: the scanned dual-stream blocks and the output
    head. Subclasses add their conditioning (and single-stream blocks)."""

    PATCH_EMBEDDING = "x_embedder"
    # diffusers orders each token's output features (c, pt, ph, pw).
    OUT_FEATURES = "(c pt ph pw)"

    def __init__(self, config, *, rngs: nnx.Rngs):
        c = self.config = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        self.x_embedder = Linear(c.patch_features, c.dim, axes=("patch", "embed"), **kw)
        self.double_blocks = self._blocks(DualStreamBlock, c.num_layers, rngs)
        # Output head: AdaLayerNormContinuous, whose modulation chunks are (scale, shift).
        self.norm_out = Linear(
            c.dim, 2 * c.dim, axes=("embed", "modulation"), **{**kw, "dtype": jnp.float32}
        )
        self.proj_out = Linear(c.dim, c.out_features, axes=("embed", "patch"), **kw)

    def _blocks(self, block: type[_Block], num_layers: int, rngs: nnx.Rngs) -> _Block:
        c = self.config
        return _stack(block, num_layers, c.dim, c.num_heads, c.mlp_dim, rngs=rngs, **_block_kw(c))

    def _refiner(self, rngs: nnx.Rngs) -> TokenRefiner:
        c = self.config
        return TokenRefiner(
            c.text_dim,
            c.dim,
            c.num_heads,
            c.refiner_mlp_dim,
            c.num_refiner_layers,
            freq_dim=c.freq_dim,
            remat=c.remat,
            rngs=rngs,
            **_block_kw(c),
        )

    # -- stages -------------------------------------------------------------------------------

    def run_double_blocks(
        self,
        tokens: Float[Array, "b l d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        *,
        attention_fn: JointAttentionFn | None = None,
    ) -> tuple[Float[Array, "b l d"], Float[Array, "b s d"]]:
        """All dual-stream blocks under one `lax.scan`; returns (video tokens, text tokens)."""
        key_mask = _joint_mask(tokens.shape[1], cond.text_mask)

        def step(block, carry):
            x, context = carry
            return block(x, context, cond.temb, angles, key_mask, attention_fn=attention_fn)

        return scan_layers(self.double_blocks, (tokens, cond.text), step, remat=self.config.remat)

    def run_blocks(
        self,
        tokens: Float[Array, "b l d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        *,
        attention_fn: JointAttentionFn | None = None,
    ) -> Float[Array, "b l d"]:
        """All dual-stream blocks under one `lax.scan`; returns the video tokens."""
        tokens, _ = self.run_double_blocks(tokens, cond, angles, attention_fn=attention_fn)
        return tokens

    def unembed(
        self, tokens: Float[Array, "b l d"], cond: Conditioning, grid: tuple[int, int, int]
    ) -> Float[Array, "b t h w c"]:
        """Modulated output head and unpatchify back to a channels-last latent (float32)."""
        scale, shift = _chunks(self.norm_out(jax.nn.silu(cond.temb)), 2)
        return self._head(tokens, (shift, scale), grid)


def _block_kw(c) -> dict:
    """The keyword arguments every block and the refiner take from a config."""
    return dict(
        eps=c.eps,
        attention_impl=c.attention_impl,
        dtype=c.compute_dtype,
        param_dtype=c.storage_dtype,
    )


def _joint_mask(num_video: int, text_mask: Bool[Array, "b s"]) -> Bool[Array, "b l+s"]:
    """Key mask over [video; text]: every video token, the real text tokens."""
    video = jnp.ones((text_mask.shape[0], num_video), bool)
    return jnp.concatenate([video, jnp.asarray(text_mask).astype(bool)], axis=1)


def check_text(text, text_mask, text_dim: int, batch: int) -> None:
    """Raises ValueError unless text is (b, s, text_dim) and text_mask (b, s)."""
    if text.ndim != 3 or text.shape[0] != batch or text.shape[-1] != text_dim:
        raise ValueError(f"text must be ({batch}, s, {text_dim}), got {text.shape}")
    if text_mask.shape != text.shape[:2]:
        raise ValueError(f"text_mask must be {text.shape[:2]}, got {text_mask.shape}")


class HunyuanVideoTransformer(DualStreamDiT):
    """HunyuanVideo text-to-video DiT: `(x, timestep, text, text_mask, pooled, guidance) -> v`.

    Inputs are channels-last latents; dual-stream blocks then single-stream blocks, each stack
    created with a leading "layers" axis and run with `jax.lax.scan`.
    """

    def __init__(self, config: HunyuanVideoConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        c = config
        f32: dict[str, Any] = dict(dtype=jnp.float32, param_dtype=c.storage_dtype, rngs=rngs)
        self.time_embedder = MLPEmbedder(c.freq_dim, c.dim, in_axis="freq", **f32)
        self.guidance_embedder = (
            MLPEmbedder(c.freq_dim, c.dim, in_axis="freq", **f32) if c.guidance_embeds else None
        )
        self.pooled_embedder = MLPEmbedder(c.pooled_dim, c.dim, in_axis="text_embed", **f32)
        self.refiner = self._refiner(rngs)
        self.single_blocks = self._blocks(SingleStreamBlock, c.num_single_layers, rngs)

    def condition(
        self,
        timestep: Float[Array, " b"],
        text: Float[Array, "b s e"],
        text_mask: Bool[Array, "b s"],
        pooled: Float[Array, "b p"],
        guidance: Float[Array, " b"] | None = None,
    ) -> Conditioning:
        """Vector conditioning and refined text for one forward pass.

        Args:
          timestep: (b,) in [0, 1000].
          text: (b, s, text_dim) LLM text embeddings; text_mask: (b, s), True for real tokens.
          pooled: (b, pooled_dim) pooled CLIP embedding.
          guidance: (b,) embedded guidance (the pipeline passes guidance_scale * 1000); required
            exactly when the config has `guidance_embeds`.
        """
        c = self.config
        if timestep.ndim != 1:
            raise ValueError(f"timestep must be (b,), got {timestep.shape}")
        b = timestep.shape[0]
        check_text(text, text_mask, c.text_dim, b)
        if pooled.shape != (b, c.pooled_dim):
            raise ValueError(f"pooled must be ({b}, {c.pooled_dim}), got {pooled.shape}")
        if (guidance is None) == c.guidance_embeds:
            raise ValueError(
                "guidance (b,) is required by this model"
                if c.guidance_embeds
                else "this model has no guidance embedding; pass guidance=None"
            )
        temb = self.time_embedder(timestep_embedding(timestep, c.freq_dim))
        temb = temb + self.pooled_embedder(pooled.astype(jnp.float32))
        if guidance is not None:
            if guidance.shape != (b,):
                raise ValueError(f"guidance must be ({b},), got {guidance.shape}")
            assert self.guidance_embedder is not None  # guidance given iff guidance_embeds
            temb = temb + self.guidance_embedder(timestep_embedding(guidance, c.freq_dim))
        mask = jnp.asarray(text_mask).astype(bool)
        # HunyuanVideo's refiner lets every token attend to the first text token, padded or
        # not (the first token is always real with right padding, as the pipeline produces).
        refined = self.refiner(
            text.astype(c.compute_dtype), timestep, mask, key_mask=mask.at[:, 0].set(True)
        )
        return Conditioning(temb=temb, text=refined, text_mask=mask)

    def run_single_blocks(
        self,
        tokens: Float[Array, "b l d"],
        text: Float[Array, "b s d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        *,
        attention_fn: JointAttentionFn | None = None,
    ) -> tuple[Float[Array, "b l d"], Float[Array, "b s d"]]:
        """All single-stream blocks under one `lax.scan` over the joint [video; text] tokens."""
        num_video = tokens.shape[1]
        key_mask = _joint_mask(num_video, cond.text_mask)
        x = shard(jnp.concatenate([tokens, text.astype(tokens.dtype)], axis=1), _VIDEO)

        def step(block, x):
            return block(
                x, cond.temb, angles, key_mask, num_video=num_video, attention_fn=attention_fn
            )

        x = scan_layers(self.single_blocks, x, step, remat=self.config.remat)
        return x[:, :num_video], x[:, num_video:]

    def run_blocks(
        self,
        tokens: Float[Array, "b l d"],
        cond: Conditioning,
        angles: Float[Array, "l k/2"] | None,
        *,
        attention_fn: JointAttentionFn | None = None,
    ) -> Float[Array, "b l d"]:
        """Dual-stream then single-stream blocks; returns the video tokens."""
        tokens, text = self.run_double_blocks(tokens, cond, angles, attention_fn=attention_fn)
        tokens, _ = self.run_single_blocks(tokens, text, cond, angles, attention_fn=attention_fn)
        return tokens
