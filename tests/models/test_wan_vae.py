"""Wan 2.1 / 2.2 VAE: config validation, shapes, chunking invariances, bad input, checkpoints."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.models._vae_cases import assert_decoder_traced_once_per_chunk, latents, video

from vidax.checkpoint import CheckpointError, export_state, save_file
from vidax.models.wan_vae import (
    PRESETS,
    WanVAE,
    WanVAEConfig,
    from_diffusers_config,
    key_map,
    load,
    save,
    to_diffusers_config,
)
from vidax.models.wan_vae import model as wan_vae_model
from vidax.sharding import PARAM_AXES

TINY = PRESETS["tiny"]
WAN22 = PRESETS["wan2.2-tiny"]


@pytest.fixture(scope="module")
def vae():
    return WanVAE(TINY, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def wan22():
    return WanVAE(WAN22, rngs=nnx.Rngs(0))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_dim": 0}, "base_dim"),
        ({"dim_mult": ()}, "dim_mult"),
        ({"temperal_downsample": (True, True)}, "temperal_downsample has 2 entries"),
        ({"dim_mult": (1, 2, 2, 2, 2), "temperal_downsample": (True,) * 4}, "at most 2"),
        ({"attn_scales": (0.3,)}, "attn_scales entry 0.3"),
        ({"latents_mean": (0.0,) * 15}, "latents_mean has 15 values"),
        ({"latents_std": (1.0,) * 15 + (0.0,)}, "positive"),
        ({"dtype": "int8"}, "dtype"),
        ({"conv_impl": "fast"}, "conv_impl"),
        ({"patch_size": 0, "in_channels": 12}, "patch_size must be positive"),
        ({"patch_size": 2}, "in_channels=3 must be a multiple of patch_size\\*\\*2=4"),
        ({"patch_size": 2, "in_channels": 12}, "out_channels=3 must be a multiple"),
        ({"is_residual": True, "attn_scales": (1.0,)}, "no attention"),
        # The last stage's shortcut would average 4 channels down to 8.
        ({"is_residual": True, "dim_mult": (1, 2, 4, 8)}, "encoder stage 384 -> 768"),
    ],
)
def test_config_rejects_inconsistent_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WanVAEConfig(**kwargs)


def test_config_derived_sizes():
    wan = PRESETS["wan2.1"]
    assert (wan.spatial_factor, wan.temporal_factor) == (8, 4)
    assert wan.latent_frames(81) == 21 and wan.video_frames(21) == 81
    assert wan.encoder_dims == (96, 96, 192, 384, 384)
    assert wan.decoder_dims == (384, 384, 384, 192, 96)
    small = WanVAEConfig(dim_mult=(1, 2, 2), temperal_downsample=(True, False))
    assert (small.spatial_factor, small.temporal_factor) == (4, 2)
    wan22 = PRESETS["wan2.2-vae"]
    assert (wan22.spatial_factor, wan22.temporal_factor) == (16, 4)  # 8x downsampling x 2x2 patches
    assert (wan22.video_in_channels, wan22.video_out_channels) == (3, 3)
    assert wan22.latent_frames(121) == 31
    assert wan22.encoder_stages == (
        (160, 160, "downsample2d"),
        (160, 320, "downsample3d"),
        (320, 640, "downsample3d"),
        (640, 640, None),
    )
    # Residual up stages keep their input channels (Wan 2.1's upsamplers halve them).
    assert wan22.decoder_layout == (
        (1024, 1024, "upsample3d"),
        (1024, 1024, "upsample3d"),
        (1024, 512, "upsample2d"),
        (512, 256, None),
    )
    assert wan.decoder_layout[1:] == (
        (192, 384, "upsample3d"),
        (192, 192, "upsample2d"),
        (96, 96, None),
    )
    # Lists (as in a diffusers config.json) are stored as tuples, so configs stay hashable.
    assert hash(WanVAEConfig(dim_mult=[1, 2], temperal_downsample=[False]))


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_to_diffusers_config_round_trips(preset):
    kwargs = to_diffusers_config(PRESETS[preset])
    assert all(not isinstance(v, tuple) for v in kwargs.values())  # as diffusers stores them
    assert from_diffusers_config(kwargs) == PRESETS[preset]


def test_from_diffusers_config():
    cfg = from_diffusers_config(
        {
            "_class_name": "AutoencoderKLWan",
            "base_dim": 8,
            "z_dim": 4,
            "dim_mult": [1, 2],
            "temperal_downsample": [True],
            "dropout": 0.0,
            # diffusers' defaults, kept for any z_dim; they cannot describe a 4-channel latent.
            "latents_mean": list(PRESETS["wan2.1"].latents_mean),
            "latents_std": list(PRESETS["wan2.1"].latents_std),
            "is_residual": False,
            "patch_size": None,
        }
    )
    assert cfg.dim_mult == (1, 2) and cfg.temperal_downsample == (True,)
    assert cfg.latents_mean is None and cfg.latents_std is None
    assert not cfg.is_residual and cfg.patch_size is None
    # Wan 2.2, as its conversion script writes it (`clip_output` is no AutoencoderKLWan argument).
    wan22 = from_diffusers_config(
        {
            **to_diffusers_config(PRESETS["wan2.2-vae"]),
            "clip_output": False,
            "scale_factor_spatial": 16,
        }
    )
    assert wan22 == PRESETS["wan2.2-vae"]
    with pytest.raises(ValueError, match="multiple of patch_size"):
        from_diffusers_config({"patch_size": 2})  # diffusers' default in_channels=3
    with pytest.raises(ValueError, match="unknown"):
        from_diffusers_config({"base_dimm": 8})
    with pytest.raises(ValueError, match="latents_mean has 3 values"):
        from_diffusers_config({"z_dim": 4, "latents_mean": [0.0, 1.0, 2.0]})


# diffusers' AutoencoderKLWan() has 126,892,531 parameters; with the Wan 2.2 arguments
# (base_dim=160, decoder_base_dim=256, z_dim=48, is_residual, patch_size=2, 12 channels)
# 704,688,668.
@pytest.mark.parametrize(("preset", "size"), [("wan2.1", 126_892_531), ("wan2.2-vae", 704_688_668)])
def test_preset_size_and_key_map_coverage(preset, size):
    abstract = nnx.eval_shape(lambda: WanVAE(PRESETS[preset], rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    flat = {
        ".".join(str(getattr(k, "key", k)) for k in path): v
        for path, v in jax.tree_util.tree_flatten_with_path(
            params, is_leaf=lambda v: isinstance(v, nnx.Variable)
        )[0]
    }
    assert sum(int(np.prod(v.get_value().shape)) for v in flat.values()) == size
    rules = key_map(PRESETS[preset])
    assert sorted(r.target for r in rules) == sorted(flat)
    assert len({r.source for r in rules}) == len(rules)
    for v in flat.values():
        axes = v.get_metadata().get("sharding") or v.get_metadata().get("out_sharding")
        assert axes is not None and set(axes) <= PARAM_AXES, axes


# ---------------------------------------------------------------- shapes and invariances


# Shared shapes so the tests below reuse the compiled encode/decode: 2 videos of 9 frames at
# 16x24 pixels <-> 3 latent frames at 2x3.
VIDEO = (2, 9, 16, 24, 3)
LATENTS = (2, 3, 2, 3, 4)


def test_encode_decode_shapes_and_range(vae):
    z = vae.encode(video(VIDEO))
    assert z.shape == LATENTS and z.dtype == jnp.float32
    x = vae.decode(z)
    assert x.shape == VIDEO
    assert float(jnp.abs(x).max()) <= 1.0
    assert bool(jnp.isfinite(x).all())


def test_decode_chunked_equals_one_step_and_is_causal(vae):
    z = latents(LATENTS)
    per_frame = vae.decode(z)  # one latent frame per scan step, as diffusers
    one_step = vae.decode(z, latents_per_step=2)  # frame 0, then both remaining latents at once
    assert float(jnp.mean(jnp.abs(per_frame) < 1)) > 0.5  # mostly unclamped, so comparable
    np.testing.assert_allclose(per_frame, one_step, rtol=0, atol=1e-5)
    # Causality: decoding the first 2 latent frames gives the first 5 frames of decoding 3.
    prefix = vae.decode(z[:, :2])
    np.testing.assert_allclose(prefix, per_frame[:, :5], rtol=0, atol=1e-6)
    assert float(jnp.abs(per_frame[:, 5:] - per_frame[:, 4:5]).max()) > 1e-3  # not constant


def test_encode_chunked_equals_one_step_and_is_causal(vae):
    x = video(VIDEO)
    chunked = vae.encode(x)  # frame 0, then 4-frame chunks, as diffusers
    one_step = vae.encode(x, frames_per_step=8)  # frame 0, then all 8 frames at once
    scale = float(jnp.abs(chunked).max())
    np.testing.assert_allclose(chunked, one_step, rtol=0, atol=1e-5 * scale)
    # Causality: encoding the first 5 frames gives the first 2 latent frames of encoding 9.
    prefix = vae.encode(x[:, :5])
    np.testing.assert_allclose(prefix, chunked[:, :2], rtol=0, atol=1e-6 * scale)
    # Both videos of the batch are encoded independently.
    np.testing.assert_allclose(vae.encode(x[1:, :5]), prefix[1:], rtol=0, atol=1e-6 * scale)


def test_normalisation_round_trip(vae):
    z = latents((1, 2, 2, 2, 4))
    np.testing.assert_allclose(vae.normalize(vae.denormalize(z)), z, atol=1e-6)
    raw = vae.denormalize(jnp.zeros((1, 1, 1, 1, 4)))
    np.testing.assert_allclose(raw.reshape(-1), TINY.latents_mean, atol=1e-7)


def test_scan_traces_one_chunk_body_for_any_length(vae, monkeypatch):
    """The decoder body is traced twice (frame 0 and the scan step) whatever the length."""
    assert_decoder_traced_once_per_chunk(
        vae, monkeypatch, wan_vae_model.Decoder, "__call__", (2, 2, 4)
    )


@pytest.mark.slow
def test_decode_memory_is_flat_in_frames(vae):
    graphdef, state = nnx.split(vae)

    def peak(t):
        fn = jax.jit(lambda s, z: nnx.merge(graphdef, s).decode_raw(z))
        mem = fn.lower(state, jnp.zeros((1, t, 8, 8, 4))).compile().memory_analysis()
        return mem.temp_size_in_bytes, mem.output_size_in_bytes

    temp_short, out_short = peak(3)
    temp_long, out_long = peak(17)
    assert out_long / out_short == pytest.approx(65 / 9, rel=1e-6)
    # Only the output grows; the scan temporaries are one chunk's worth.
    assert temp_long <= 1.1 * temp_short + 2 * out_long, (temp_short, temp_long, out_long)


@pytest.mark.slow
def test_bfloat16_decode_tracks_float32(vae):
    bf16 = WanVAE(dataclasses.replace(TINY, dtype="bfloat16"), rngs=nnx.Rngs(0))
    z = latents((1, 2, 2, 2, 4))
    got, want = bf16.decode(z), vae.decode(z)
    assert got.dtype == jnp.bfloat16
    err = float(jnp.abs(got.astype(jnp.float32) - want).max())
    assert err <= 0.05 * float(jnp.abs(want).max())


@pytest.mark.slow
def test_reconstruction_loss_has_finite_gradients():
    vae = WanVAE(
        dataclasses.replace(TINY, dim_mult=(1, 2), temperal_downsample=(True,)), rngs=nnx.Rngs(0)
    )
    x = video((1, 5, 8, 8, 3))

    @nnx.jit
    def grads(vae, x):
        def loss(vae):
            mu, _ = vae.moments(x)
            return jnp.mean(jnp.square(vae.decode_raw(mu) - x))

        return nnx.grad(loss)(vae)

    g = jax.tree.leaves(grads(vae, x))
    assert all(bool(jnp.isfinite(v).all()) for v in g)
    assert sum(float(jnp.abs(v).sum()) for v in g) > 0


def test_wan22_shapes_and_chunking_invariances(wan22):
    """Wan 2.2: 16x16 pixels per latent, and the parameter-free shortcuts see the same frames
    whatever the chunking (chunks split time at multiples of the temporal strides). The parity
    tests check diffusers' chunking, frame 0 then one chunk per 4 frames or latent frame."""
    x = video((1, 9, 32, 48, 3))
    z = wan22.encode(x)
    assert z.shape == (1, 3, 2, 3, 4) and z.dtype == jnp.float32
    one_step = wan22.encode(x, frames_per_step=8)
    scale = float(jnp.abs(z).max())
    np.testing.assert_allclose(one_step, z, rtol=0, atol=1e-5 * scale)

    zs = latents((1, 3, 2, 3, 4))
    pixels = wan22.decode(zs)
    assert pixels.shape == (1, 9, 32, 48, 3)
    assert float(jnp.mean(jnp.abs(pixels) < 1)) > 0.5  # mostly unclamped, so comparable
    np.testing.assert_allclose(wan22.decode(zs, latents_per_step=2), pixels, rtol=0, atol=1e-5)


def test_patchify_round_trips_and_shortcuts_invert():
    x = video((2, 3, 4, 6, 3))
    patches = wan_vae_model.patchify(x, 2)
    assert patches.shape == (2, 3, 2, 3, 12)
    # Channel c * 4 + j * 2 + i holds the pixel at row i, column j of each patch.
    np.testing.assert_array_equal(patches[:, :, :, :, 1 * 4 + 1 * 2 + 0], x[:, :, 0::2, 1::2, 1])
    np.testing.assert_array_equal(wan_vae_model.unpatchify(patches, 2), x)
    # avg_down averages exactly the copies dup_up makes.
    h = video((2, 2, 3, 2, 8))
    up = wan_vae_model.dup_up(h, 4, 2, 2, first=False)
    assert up.shape == (2, 4, 6, 4, 4)
    np.testing.assert_allclose(wan_vae_model.avg_down(up, 8, 2, 2), h, rtol=0, atol=1e-6)
    assert wan_vae_model.dup_up(h, 4, 2, 2, first=True).shape == (2, 3, 6, 4, 4)


# ---------------------------------------------------------------- tiling


def test_tiling_blends_to_the_untiled_result_for_a_local_map():
    """With a pointwise map every tile is exact, so cross-fading must reproduce the whole."""
    x = latents((1, 2, 7, 9, 3))

    def upsample(t):
        return jnp.repeat(jnp.repeat(t * 2.0, 4, axis=2), 4, axis=3)

    # One jit around the whole tiling: eager, every slice shape would compile on its own.
    tiled = jax.jit(
        lambda x: wan_vae_model._tiled(upsample, x, tile_in=(3, 4), stride_in=(2, 3), scale=4)
    )(x)
    np.testing.assert_allclose(tiled, upsample(x), atol=1e-6)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((1, 8, 16, 16, 3), "1 \\+ 4k frames"),
        ((1, 9, 12, 16, 3), "multiples of 8"),
        ((1, 9, 16, 16, 4), "4 channels, expected 3"),
        ((9, 16, 16, 3), "video must be"),
    ],
)
def test_encode_rejects_bad_video(vae, shape, match):
    with pytest.raises(ValueError, match=match):
        vae.encode(jnp.zeros(shape))


def test_wan22_encode_takes_pixels_not_patches(wan22):
    with pytest.raises(ValueError, match="12 channels, expected 3"):
        wan22.encode(jnp.zeros((1, 5, 16, 16, 12)))
    with pytest.raises(ValueError, match="multiples of 16"):
        wan22.encode(jnp.zeros((1, 5, 24, 16, 3)))


def test_decode_rejects_bad_latents_and_tiles(vae):
    with pytest.raises(ValueError, match="expected z_dim=4"):
        vae.decode(jnp.zeros((1, 2, 2, 2, 16)))
    with pytest.raises(ValueError, match="latents must be"):
        vae.decode(jnp.zeros((2, 2, 2, 4)))
    with pytest.raises(ValueError, match="latents_per_step=2"):
        vae.decode(jnp.zeros((1, 4, 2, 2, 4)), latents_per_step=2)
    with pytest.raises(ValueError, match="multiples of 8"):
        vae.decode(jnp.zeros((1, 1, 4, 4, 4)), tile_size=12)
    with pytest.raises(ValueError, match="exceeds tile_size"):
        vae.decode(jnp.zeros((1, 1, 4, 4, 4)), tile_size=16, tile_stride=24)
    with pytest.raises(ValueError, match="frames_per_step"):
        vae.encode(jnp.zeros((1, 9, 8, 8, 3)), frames_per_step=6)


# ---------------------------------------------------------------- checkpoints


def test_save_load_round_trip(vae, tmp_path):
    save(vae, tmp_path / "vae.safetensors")
    loaded = load(tmp_path / "vae.safetensors", "tiny")
    want = nnx.state(vae, nnx.Param)
    got = nnx.state(loaded, nnx.Param)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(a, b)


def test_corrupt_checkpoints_name_the_key(vae, tmp_path):
    tensors = export_state(nnx.state(vae, nnx.Param), key_map(TINY))
    key = "decoder.up_blocks.1.resnets.0.conv1.weight"
    assert tensors[key].ndim == 5  # torch Conv3d layout (out, in, kt, kh, kw)

    bad = dict(tensors, **{key: tensors[key][:, :, :2]})
    save_file(bad, tmp_path / "shape.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load(tmp_path / "shape.safetensors", TINY)

    missing = {k: v for k, v in tensors.items() if k != "encoder.norm_out.gamma"}
    save_file(missing, tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match=r"missing key 'encoder\.norm_out\.gamma'"):
        load(tmp_path / "missing.safetensors", TINY)

    with pytest.raises(ValueError, match="unknown WanVAE preset"):
        load(tmp_path / "missing.safetensors", "wan2.2")
