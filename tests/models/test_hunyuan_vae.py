"""HunyuanVideo VAE: config, tiling helpers, shapes, scaling, bad input, checkpoints, pipeline."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.models._vae_cases import flat_params, latents, video

import vidax.pipeline
from vidax.checkpoint import CheckpointError, export_state, save_file, save_model
from vidax.models import get, get_vae, hunyuan
from vidax.models.hunyuan_vae import (
    NO_TILING,
    PRESETS,
    HunyuanVideoVAE,
    HunyuanVideoVAEConfig,
    Tiling,
    from_diffusers_config,
    key_map,
    load,
    save,
)
from vidax.models.hunyuan_vae import model as hv_model
from vidax.sharding import PARAM_AXES

TINY = PRESETS["hunyuanvideo-tiny"]


@pytest.fixture(scope="module")
def vae():
    return HunyuanVideoVAE(TINY, rngs=nnx.Rngs(0))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"z_dim": 0}, "z_dim"),
        ({"block_out_channels": ()}, "block_out_channels"),
        ({"block_out_channels": (128, 256, 500, 512)}, "does not divide width 500"),
        ({"spatial_factor": 6}, "power of 2"),
        ({"temporal_factor": 8}, "temporal_factor must be 4"),
        ({"block_out_channels": (128, 256)}, "2 stages give 4x spatial and 2x temporal"),
        ({"spatial_factor": 32}, "16x spatial and 4x temporal compression, not 32x"),
        ({"scaling_factor": 0.0}, "scaling_factor"),
        ({"tiling": Tiling(size=100, stride=64)}, "multiples of the spatial factor 8"),
        ({"tiling": Tiling(frames=10, frames_stride=8)}, "multiples of the temporal factor 4"),
        ({"dtype": "int8"}, "dtype"),
    ],
)
def test_config_rejects_inconsistent_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HunyuanVideoVAEConfig(**kwargs)


def test_tiling_rejects_bad_strides():
    with pytest.raises(ValueError, match="smaller than its stride"):
        Tiling(size=64, stride=128)
    with pytest.raises(ValueError, match="positive"):
        Tiling(frames=16, frames_stride=0)
    assert NO_TILING.size is None and NO_TILING.frames is None


def test_layout_follows_the_diffusers_rule():
    cfg = PRESETS["hunyuanvideo"]
    # Stages 0-2 halve space; stages 1-2 (not the last) also halve time.
    assert [f for _, _, f in cfg.encoder_layout] == [(1, 2), (2, 2), (2, 2), (1, 1)]
    assert [(i, o) for i, o, _ in cfg.encoder_layout] == [
        (128, 128),
        (128, 256),
        (256, 512),
        (512, 512),
    ]
    assert [f for _, _, f in cfg.decoder_layout] == [(1, 2), (2, 2), (2, 2), (1, 1)]
    assert [(i, o) for i, o, _ in cfg.decoder_layout] == [
        (512, 512),
        (512, 512),
        (512, 256),
        (256, 128),
    ]
    # Three stages still reach 8x / 4x: the last stage then halves space too.
    three = HunyuanVideoVAEConfig(block_out_channels=(32, 64, 64))
    assert [f for _, _, f in three.encoder_layout] == [(2, 2), (2, 2), (1, 2)]
    assert cfg.latent_frames(129) == 33 and cfg.video_frames(33) == 129


def test_from_diffusers_config():
    cfg = from_diffusers_config(
        {
            "_class_name": "AutoencoderKLHunyuanVideo",
            "latent_channels": 4,
            "block_out_channels": [8, 8, 16, 16],
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "down_block_types": ["HunyuanVideoDownBlock3D"] * 4,
            "act_fn": "silu",
            "scaling_factor": 0.5,
        }
    )
    assert (cfg.z_dim, cfg.block_out_channels, cfg.scaling_factor) == (4, (8, 8, 16, 16), 0.5)
    with pytest.raises(ValueError, match="only HunyuanVideoUpBlock3D"):
        from_diffusers_config({"up_block_types": ["UpBlock3D"] * 4})
    with pytest.raises(ValueError, match="act_fn"):
        from_diffusers_config({"act_fn": "gelu"})
    with pytest.raises(ValueError, match="unknown"):
        from_diffusers_config({"latent_channel": 4})


def test_released_preset_size_axes_and_key_map_coverage():
    abstract = nnx.eval_shape(lambda: HunyuanVideoVAE(PRESETS["hunyuanvideo"], rngs=nnx.Rngs(0)))
    flat = flat_params(abstract)
    # diffusers' AutoencoderKLHunyuanVideo() has 246,478,803 parameters.
    assert sum(int(np.prod(v.get_value().shape)) for v in flat.values()) == 246_478_803
    rules = key_map(PRESETS["hunyuanvideo"])
    assert sorted(r.target for r in rules) == sorted(flat)
    assert len({r.source for r in rules}) == len(rules)
    for v in flat.values():
        axes = v.get_metadata().get("sharding") or v.get_metadata().get("out_sharding")
        assert axes is not None and set(axes) <= PARAM_AXES, axes


def test_registry_pairs_the_dits_with_these_vaes():
    tiny = get("hunyuanvideo-tiny")
    assert get_vae(tiny.vae).config == TINY
    assert TINY.z_dim == hunyuan.PRESETS["tiny"].in_channels
    assert get_vae(get("hunyuanvideo").vae).config == PRESETS["hunyuanvideo"]
    assert get_vae(get("hunyuanvideo").vae).module is HunyuanVideoVAE
    # Wan's "tiny" VAE is not shadowed by ours.
    assert get_vae("tiny").family == "wan"


# ---------------------------------------------------------------- tiling helpers


def _frames_up(x):
    """A causal-decoder stand-in: frame 0 -> 1 frame, every later frame -> 4 equal frames."""
    y = 2.0 * x + 1.0
    return jnp.concatenate([y[:, :1], jnp.repeat(y[:, 1:], 4, axis=1)], axis=1)


def _frames_down(x):
    """A causal-encoder stand-in: frames 0, 4, 8, ... of 1 + 4k."""
    return 0.5 * x[:, ::4]


@pytest.mark.parametrize("t", [4, 5, 6, 10])
def test_tiled_frames_reassembles_a_local_map_exactly(t):
    """With a per-frame map every tile is exact, so blending and cropping must rebuild it.

    The settings are `Tiling(frames=8, frames_stride=4)`'s: 3-latent windows every latent
    (the last of one frame skipped), 9-frame windows every 4 frames.
    """
    z = latents((1, t, 2, 3, 2))
    tiled = jax.jit(
        lambda z: hv_model.tiled_frames(
            _frames_up, z, tile=3, stride=1, keep=4, blend=4, total=1 + 4 * (t - 1)
        )
    )(z)
    np.testing.assert_allclose(tiled, _frames_up(z), atol=1e-6)
    x = latents((1, 1 + 4 * (t - 1), 2, 3, 2))
    tiled = jax.jit(
        lambda x: hv_model.tiled_frames(_frames_down, x, tile=9, stride=4, keep=1, blend=1, total=t)
    )(x)
    np.testing.assert_allclose(tiled, _frames_down(x), atol=1e-6)


def test_tiled_2d_reassembles_a_local_map_and_traces_once_per_tile_shape():
    x = latents((1, 2, 7, 9, 3))
    calls = []

    def upsample(v):
        calls.append(v.shape[2:4])
        return jnp.repeat(jnp.repeat(v * 2.0, 4, axis=2), 4, axis=3)

    tiled = jax.jit(lambda x: hv_model.tiled_2d(upsample, x, tile=3, stride=2, scale=4))(x)
    np.testing.assert_allclose(tiled, upsample(x), atol=1e-6)
    # Rows start at 0,2,4,6 (heights 3,3,3,1), columns at 0,2,4,6,8 (widths 3,3,3,3,1):
    # 20 tiles of 4 shapes, each traced once.
    assert sorted(calls[:-1]) == [(1, 1), (1, 3), (3, 1), (3, 3)]


# ---------------------------------------------------------------- the model

# Shared shapes so tests reuse compiled programs: 2 videos of 9 frames at 16x24 pixels <->
# 3 latent frames at 2x3.
VIDEO = (2, 9, 16, 24, 3)
LATENTS = (2, 3, 2, 3, 16)


def test_encode_decode_shapes_and_range(vae):
    # Values, scaling and batching are checked against diffusers in tests/reference.
    x = video(VIDEO)
    z = vae.encode(x)
    assert z.shape == LATENTS and z.dtype == jnp.float32
    y = vae.decode(z)
    assert y.shape == VIDEO
    assert float(jnp.abs(y).max()) <= 1.0 and bool(jnp.isfinite(y).all())
    assert float(jnp.std(y)) > 1e-3


@pytest.mark.slow
def test_decode_accepts_one_latent_frame(vae):
    x = vae.decode(latents((1, 1, 2, 2, 16)))
    assert x.shape == (1, 1, 16, 16, 3)


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


def test_decode_rejects_bad_latents_and_tiles(vae):
    with pytest.raises(ValueError, match="expected z_dim=16"):
        vae.decode(jnp.zeros((1, 2, 2, 2, 4)))
    with pytest.raises(ValueError, match="latents must be"):
        vae.decode(jnp.zeros((2, 2, 2, 16)))
    with pytest.raises(ValueError, match="empty axis"):
        vae.decode(jnp.zeros((1, 0, 2, 2, 16)))
    with pytest.raises(ValueError, match="multiples of the spatial factor"):
        vae.decode(jnp.zeros((1, 1, 4, 4, 16)), tiling=Tiling(size=12, stride=12))
    with pytest.raises(ValueError, match="multiples of the temporal factor"):
        vae.encode(jnp.zeros((1, 9, 8, 8, 3)), tiling=Tiling(frames=6, frames_stride=6))


@pytest.mark.slow
def test_temporal_tiling_bounds_decode_memory(vae):
    graphdef, state = nnx.split(vae)
    tiling = Tiling(size=None, frames=8, frames_stride=4)

    def peak(t, tiling):
        fn = jax.jit(lambda s, z: nnx.merge(graphdef, s).decode_raw(z, tiling=tiling))
        mem = fn.lower(state, jnp.zeros((1, t, 4, 4, 16))).compile().memory_analysis()
        return mem.temp_size_in_bytes, mem.output_size_in_bytes

    (short, out_short), (long, out_long) = peak(5, tiling), peak(17, tiling)
    assert out_long / out_short == pytest.approx(65 / 17, rel=1e-6)
    # Tiles run one at a time: temporaries grow with the collected tile outputs (a small
    # multiple of the output), not with whole-clip activations as untiled decoding does.
    untiled, _ = peak(17, NO_TILING)
    assert long - short <= 3 * out_long, (short, long, out_long)
    assert long < 0.5 * untiled, (long, untiled)


@pytest.mark.slow
def test_bfloat16_decode_tracks_float32(vae):
    bf16 = HunyuanVideoVAE(dataclasses.replace(TINY, dtype="bfloat16"), rngs=nnx.Rngs(0))
    z = latents((1, 2, 2, 2, 16))
    got, want = bf16.decode_raw(z), vae.decode_raw(z)
    assert got.dtype == jnp.bfloat16
    err = float(jnp.abs(got.astype(jnp.float32) - want).max())
    assert err <= 0.05 * float(jnp.abs(want).max())


# ---------------------------------------------------------------- checkpoints


def test_save_load_round_trip(vae, tmp_path):
    save(vae, tmp_path / "vae.safetensors")
    loaded = load(tmp_path / "vae.safetensors", "hunyuanvideo-tiny")
    want, got = flat_params(vae), flat_params(loaded)
    assert sorted(want) == sorted(got)
    for key in want:
        np.testing.assert_array_equal(want[key].get_value(), got[key].get_value(), err_msg=key)


def test_corrupt_checkpoints_name_the_key(vae, tmp_path):
    tensors = export_state(nnx.state(vae, nnx.Param), key_map(TINY))
    key = "decoder.up_blocks.1.resnets.0.conv1.conv.weight"
    assert tensors[key].ndim == 5  # torch Conv3d layout (out, in, kt, kh, kw)

    bad = dict(tensors, **{key: tensors[key][:, :, :2]})
    save_file(bad, tmp_path / "shape.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load(tmp_path / "shape.safetensors", TINY)

    gone = "encoder.mid_block.attentions.0.to_out.0.weight"
    save_file({k: v for k, v in tensors.items() if k != gone}, tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match=gone.replace(".", r"\.")):
        load(tmp_path / "missing.safetensors", TINY)

    with pytest.raises(ValueError, match="unknown HunyuanVideoVAE preset"):
        load(tmp_path / "missing.safetensors", "tiny")


# ---------------------------------------------------------------- pipeline


def test_generate_end_to_end_from_a_diffusers_folder(tmp_path):
    spec = get("hunyuanvideo-tiny")
    (tmp_path / "transformer").mkdir()
    (tmp_path / "vae").mkdir()
    dit = hunyuan.HunyuanVideoTransformer(spec.config, rngs=nnx.Rngs(0))
    save_model(
        dit,
        tmp_path / "transformer" / "diffusion_pytorch_model.safetensors",
        hunyuan.key_map(spec.config),
    )
    vae = HunyuanVideoVAE(TINY, rngs=nnx.Rngs(1))
    save(vae, tmp_path / "vae" / "diffusion_pytorch_model.safetensors")

    video = vidax.pipeline.generate(
        "hunyuanvideo-tiny",
        prompt="a red ball rolls",
        checkpoint=tmp_path,
        steps=2,
        num_frames=5,
        height=32,
        width=32,
    )
    assert video.latents.shape == (1, 2, 4, 4, 16)
    assert video.frames.shape == (5, 32, 32, 3) and video.frames.dtype == np.float32
    assert float(video.frames.min()) >= 0.0 and float(video.frames.max()) <= 1.0
    # The frames are the VAE's decode of the latents (the loaded VAE, not a random one).
    # (`pipeline.decode` reuses the compiled decode for this VAE structure.)
    want = vidax.pipeline.decode(vae, jnp.asarray(video.latents))[0]
    np.testing.assert_allclose(video.frames, want, atol=1e-5)
    assert float(video.frames.std()) > 0.01
