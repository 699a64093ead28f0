"""WanVAE vs diffusers `AutoencoderKLWan` (Wan 2.1 and Wan 2.2): random tiny models through the
real checkpoint path."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from tests.reference._torch import assert_close  # noqa: E402
from tests.reference._vae import (  # noqa: E402
    from_torch,
    saved_pair,
    to_torch,
)
from vidax.models.wan_vae import (  # noqa: E402
    PRESETS,
    WanVAE,
    from_diffusers_config,
    key_map,
    load,
    save,
)
from vidax.models.wan_vae import model as wan_vae_model  # noqa: E402

wan_torch = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_wan")

pytestmark = pytest.mark.reference

RTOL = 1e-4  # max |err| / max |reference|, float32

TINY = PRESETS["tiny"]
TINY_DIFFUSERS = {
    "base_dim": TINY.base_dim,
    "z_dim": TINY.z_dim,
    "dim_mult": list(TINY.dim_mult),
    "num_res_blocks": TINY.num_res_blocks,
    "temperal_downsample": list(TINY.temperal_downsample),
    "latents_mean": list(TINY.latents_mean),
    "latents_std": list(TINY.latents_std),
}
# 4x spatial, 2x temporal (first stage halves time), a wider decoder, no normalisation stats.
# diffusers' tiling reads the scale factors from its config, so they must be set to match.
VARIANT_DIFFUSERS = {
    "base_dim": 8,
    "decoder_base_dim": 12,
    "z_dim": 3,
    "dim_mult": [1, 2, 2],
    "num_res_blocks": 1,
    "temperal_downsample": [True, False],
    "scale_factor_spatial": 4,
    "scale_factor_temporal": 2,
}


# Wan 2.2's topology (2x2 patches, residual stages, 16x spatial, 4x temporal; the third decoder
# stage halves its channels) at tiny widths, written as diffusers spells it.
WAN22 = PRESETS["wan2.2-tiny"]
WAN22_DIFFUSERS = {
    "base_dim": 4,
    "decoder_base_dim": 6,
    "z_dim": 4,
    "num_res_blocks": 1,
    "in_channels": 12,
    "out_channels": 12,
    "is_residual": True,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "latents_mean": list(WAN22.latents_mean),
    "latents_std": list(WAN22.latents_std),
}
# The Wan2.2-TI2V-5B VAE's architecture, as diffusers' convert_wan_to_diffusers.py writes it.
WAN22_FULL_DIFFUSERS = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "in_channels": 12,
    "out_channels": 12,
    "is_residual": True,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
}


def _pair(config: dict, path):
    return saved_pair(diffusers.AutoencoderKLWan, config, path, load, from_diffusers_config)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _pair(TINY_DIFFUSERS, tmp_path_factory.mktemp("wan_vae_tiny"))


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    return _pair(VARIANT_DIFFUSERS, tmp_path_factory.mktemp("wan_vae_variant"))


@pytest.fixture(scope="module")
def wan22(tmp_path_factory):
    return _pair(WAN22_DIFFUSERS, tmp_path_factory.mktemp("wan22_vae_tiny"))


def _stats(vae):
    cfg = vae.config
    mean = np.asarray(cfg.latents_mean or (0.0,) * cfg.z_dim, np.float32)
    std = np.asarray(cfg.latents_std or (1.0,) * cfg.z_dim, np.float32)
    return mean, std


def _check_encode(ref, vae, shape, **tiles):
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    with torch.no_grad():
        mu = from_torch(ref.encode(to_torch(x)).latent_dist.mode())
    mean, std = _stats(vae)
    got = vae.encode(jnp.asarray(x), **tiles)
    assert_close(got, (mu - mean) / std, RTOL, "encode")


def _check_decode(ref, vae, shape, **tiles):
    z = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    mean, std = _stats(vae)
    with torch.no_grad():
        want = from_torch(ref.decode(to_torch(z * std + mean)).sample)
    # Mostly unclamped, so the comparison sees the decoder, not the clamp.
    assert np.mean(np.abs(want) < 1) > 0.5
    got = vae.decode(jnp.asarray(z), **tiles)
    assert_close(got, want, RTOL, "decode")
    return z, got


def test_tiny_config_round_trips_through_diffusers(tiny):
    ref, vae = tiny
    assert vae.config == TINY
    assert ref.config.scale_factor_spatial == TINY.spatial_factor


def test_encode_matches_diffusers(tiny):
    # 9 frames: frame 0, then two 4-frame chunks through the causal caches.
    _check_encode(*tiny, (2, 9, 16, 24, 3))


def test_decode_matches_diffusers(tiny):
    # 3 latent frames -> 9 frames: three decoder calls chained through the caches.
    _check_decode(*tiny, (2, 3, 2, 3, 4))


def test_variant_matches_diffusers(variant):
    ref, vae = variant
    assert (vae.config.spatial_factor, vae.config.temporal_factor) == (4, 2)
    _check_encode(ref, vae, (1, 13, 8, 12, 3))  # -> 7 latent frames
    _check_decode(ref, vae, (1, 4, 2, 3, 3))  # -> 7 frames


def test_tiled_decode_matches_diffusers(variant):
    ref, vae = variant
    # 12x12 px frames in 8 px tiles every 4 px: 3x3 tiles, blended over 4 px both ways.
    ref.enable_tiling(
        tile_sample_min_height=8,
        tile_sample_min_width=8,
        tile_sample_stride_height=4,
        tile_sample_stride_width=4,
    )
    try:
        z, tiled = _check_decode(ref, vae, (1, 3, 3, 3, 3), tile_size=8, tile_stride=4)
    finally:
        ref.disable_tiling()
    # The tiles really were decoded apart: with 2-latent tiles they see far less context than
    # the whole frame (test_tiled_decode_is_exact_away_from_seams checks realistic tiles).
    untiled = vae.decode(jnp.asarray(z))
    assert float(jnp.abs(tiled - untiled).max()) > 1e-2


@pytest.mark.slow
def test_tiled_encode_matches_diffusers(variant):
    ref, vae = variant
    ref.enable_tiling(
        tile_sample_min_height=8,
        tile_sample_min_width=8,
        tile_sample_stride_height=4,
        tile_sample_stride_width=4,
    )
    try:
        _check_encode(ref, vae, (1, 5, 12, 12, 3), tile_size=8, tile_stride=4)
    finally:
        ref.disable_tiling()


@pytest.mark.slow
def test_tiled_decode_is_exact_away_from_seams():
    """Without the (global) mid attention, pixels far from the first tile's edge are exact."""
    vae = WanVAE(from_diffusers_config(VARIANT_DIFFUSERS), rngs=nnx.Rngs(0))
    attn = vae.decoder.mid_block.attentions[0].proj
    attn.kernel[...] = jnp.zeros_like(attn.kernel[...])
    attn.bias[...] = jnp.zeros_like(attn.bias[...])
    z = jnp.asarray(np.random.default_rng(2).standard_normal((1, 2, 24, 24, 3)), jnp.float32)
    untiled = vae.decode(z)
    tiled = vae.decode(z, tile_size=64, tile_stride=48)
    assert_close(tiled[:, :, :8, :8], untiled[:, :, :8, :8], 1e-5, "top-left corner")
    err = jnp.abs(tiled - untiled)
    assert float(err.mean()) < 0.2 * float(jnp.abs(untiled).mean())


@pytest.mark.slow
def test_encoder_attention_matches_diffusers(tmp_path):
    """attn_scales adds encoder attention; diffusers can only run it without its caches.

    With no temporal downsampling the uncached torch encoder (causal zero padding over the
    whole clip) is exactly the chunked computation, so it serves as the reference.
    """
    config = {
        "base_dim": 8,
        "z_dim": 4,
        "dim_mult": [1, 2],
        "num_res_blocks": 1,
        "temperal_downsample": [False],
        "attn_scales": [1.0, 0.5],
    }
    ref, vae = _pair(config, tmp_path)
    assert sum(k.startswith("encoder.down_blocks.1.to_qkv") for k in ref.state_dict()) == 2
    x = np.random.default_rng(0).uniform(-1, 1, (1, 5, 8, 8, 3)).astype(np.float32)
    with torch.no_grad():
        h = ref.quant_conv(ref.encoder(to_torch(x)))
    mu, _ = vae.moments(jnp.asarray(x))
    assert_close(mu, from_torch(h)[..., : config["z_dim"]], RTOL, "encoder with attention")


@pytest.mark.parametrize(("pair", "config"), [("tiny", TINY_DIFFUSERS), ("wan22", WAN22_DIFFUSERS)])
def test_saved_checkpoint_is_the_diffusers_state_dict(pair, config, request, tmp_path):
    ref, vae = request.getfixturevalue(pair)
    save(vae, tmp_path / "vae.safetensors")
    saved = safetensors_torch.load_file(tmp_path / "vae.safetensors")
    want = ref.state_dict()
    assert sorted(saved) == sorted(want)
    for key, value in want.items():
        assert saved[key].shape == value.shape, key
        torch.testing.assert_close(saved[key], value, rtol=0, atol=0, msg=key)
    fresh = diffusers.AutoencoderKLWan(**config)
    fresh.load_state_dict(saved, strict=True)


@pytest.mark.parametrize(
    ("preset", "config"), [("wan2.1", {}), ("wan2.2-vae", WAN22_FULL_DIFFUSERS)]
)
def test_key_map_covers_the_full_checkpoint(preset, config):
    # The preset is the diffusers architecture (latent statistics aside: diffusers' defaults
    # are Wan 2.1's, which the Wan 2.2 preset replaces with its own 48).
    stats = dict(latents_mean=None, latents_std=None)
    assert dataclasses.replace(from_diffusers_config(config), **stats) == dataclasses.replace(
        PRESETS[preset], **stats
    )
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLWan(**config)
    shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    abstract = nnx.eval_shape(lambda: WanVAE(PRESETS[preset], rngs=nnx.Rngs(0)))
    params = {
        ".".join(str(getattr(k, "key", k)) for k in path): v.get_value()
        for path, v in jax.tree_util.tree_flatten_with_path(
            nnx.state(abstract, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
        )[0]
    }
    rules = key_map(PRESETS[preset])
    assert sorted(r.source for r in rules) == sorted(shapes)
    for rule in rules:
        src = jax.ShapeDtypeStruct(shapes[rule.source], jnp.float32)
        got = jax.eval_shape(rule.transform, src) if rule.transform else src
        assert got.shape == params[rule.target].shape, rule
        if rule.inverse is not None:
            assert jax.eval_shape(rule.inverse, got).shape == src.shape, rule


# ---------------------------------------------------------------- Wan 2.2


def test_wan22_config_round_trips_through_diffusers(wan22):
    ref, vae = wan22
    assert vae.config == WAN22
    assert vae.config.spatial_factor == ref.config.scale_factor_spatial == 16
    assert (vae.config.temporal_factor, vae.config.video_in_channels) == (4, 3)


def test_wan22_encode_matches_diffusers(wan22):
    # 9 frames at 32x48 pixels: frame 0, then two 4-frame chunks -> 3 x 2 x 3 latents.
    _check_encode(*wan22, (1, 9, 32, 48, 3))


def test_wan22_decode_matches_diffusers(wan22):
    # 3 latent frames -> 9 frames: the first chunk's single frames (time upsample and dup_up
    # shortcut alike), then two chunks through the caches, then unpatchify and clamp.
    _check_decode(*wan22, (2, 3, 2, 3, 4))


def test_wan22_tiled_decode_matches_diffusers(wan22):
    ref, vae = wan22
    # 48x48 px frames in 32 px tiles every 16 px: 3x3 tiles, blended over 8 patch rows/columns
    # (one latent frame: the blend is what is new, and the first chunk compiles fastest).
    ref.enable_tiling(
        tile_sample_min_height=32,
        tile_sample_min_width=32,
        tile_sample_stride_height=16,
        tile_sample_stride_width=16,
    )
    try:
        z, tiled = _check_decode(ref, vae, (1, 1, 3, 3, 4), tile_size=32, tile_stride=16)
    finally:
        ref.disable_tiling()
    assert float(jnp.abs(tiled - vae.decode(jnp.asarray(z))).max()) > 1e-2  # really tiled


@pytest.mark.slow
def test_wan22_tiled_encode_matches_diffusers(wan22):
    ref, vae = wan22
    # diffusers tiles the patchified video: its 16 (8) are our 32 (16) pixels.
    ref.enable_tiling(
        tile_sample_min_height=16,
        tile_sample_min_width=16,
        tile_sample_stride_height=8,
        tile_sample_stride_width=8,
    )
    try:
        _check_encode(ref, vae, (1, 5, 48, 48, 3), tile_size=32, tile_stride=16)
    finally:
        ref.disable_tiling()


def test_patchify_matches_diffusers():
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 6, 3)).astype(np.float32)
    want = from_torch(wan_torch.patchify(to_torch(x), 2))
    got = wan_vae_model.patchify(jnp.asarray(x), 2)
    np.testing.assert_array_equal(got, want)
    back = from_torch(wan_torch.unpatchify(to_torch(want), 2))
    np.testing.assert_array_equal(wan_vae_model.unpatchify(got, 2), back)


@pytest.mark.parametrize(
    ("in_dim", "out_dim", "factor_t", "t"), [(4, 8, 2, 4), (8, 8, 2, 1), (8, 4, 1, 3)]
)
def test_avg_down_matches_diffusers(in_dim, out_dim, factor_t, t):
    """t = 1 with factor_t = 2 is the first chunk, padded with a zero frame in front."""
    x = np.random.default_rng(0).standard_normal((2, t, 4, 6, in_dim)).astype(np.float32)
    ref = wan_torch.AvgDown3D(in_dim, out_dim, factor_t=factor_t, factor_s=2)
    want = from_torch(ref(to_torch(x)))
    got = wan_vae_model.avg_down(jnp.asarray(x), out_dim, factor_t, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize(("in_dim", "out_dim", "factor_t"), [(8, 8, 2), (8, 4, 1), (4, 4, 2)])
def test_dup_up_matches_diffusers(in_dim, out_dim, factor_t, first):
    x = np.random.default_rng(0).standard_normal((2, 2, 3, 2, in_dim)).astype(np.float32)
    ref = wan_torch.DupUp3D(in_dim, out_dim, factor_t=factor_t, factor_s=2)
    want = from_torch(ref(to_torch(x), first_chunk=first))
    got = wan_vae_model.dup_up(jnp.asarray(x), out_dim, factor_t, 2, first=first)
    np.testing.assert_array_equal(got, want)
