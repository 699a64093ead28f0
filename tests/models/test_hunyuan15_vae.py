"""HunyuanVideo-1.5 VAE: config, layout, streaming invariances, bad input, checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tests.models._vae_cases import (
    assert_decoder_traced_once_per_chunk,
    flat_params,
    latents,
    video,
)

import vidax.pipeline
from vidax.checkpoint import CheckpointError, export_state, save_file, save_model
from vidax.models import get, get_vae, hunyuan15
from vidax.models.hunyuan15_vae import (
    NO_TILING,
    PRESETS,
    HunyuanVideo15VAE,
    HunyuanVideo15VAEConfig,
    Tiling,
    from_diffusers_config,
    key_map,
    load,
    save,
)
from vidax.models.hunyuan15_vae import model as hv15_model
from vidax.sharding import PARAM_AXES

TINY = PRESETS["hunyuanvideo15-tiny"]


@pytest.fixture(scope="module")
def vae():
    return HunyuanVideo15VAE(TINY, rngs=nnx.Rngs(0))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"z_dim": 0}, "z_dim"),
        ({"spatial_factor": 12}, "power of 2"),
        ({"temporal_factor": 32}, "exceeds spatial_factor"),
        ({"block_out_channels": (128, 256, 512, 1024)}, "needs more than 4 stages"),
        ({"z_dim": 48}, "multiple of 2 \\* z_dim = 96"),
        ({"block_out_channels": (128, 256, 512, 1000, 1024)}, "encoder stage 2"),
        ({"tiling": Tiling()}, "frames=None"),
        ({"tiling": Tiling(size=100, stride=64, frames=None)}, "spatial factor 16"),
        ({"scaling_factor": -1.0}, "scaling_factor"),
        ({"dtype": "int8"}, "dtype"),
    ],
)
def test_config_rejects_inconsistent_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HunyuanVideo15VAEConfig(**kwargs)


def test_layout_follows_the_diffusers_rule():
    cfg = PRESETS["hunyuanvideo15"]
    assert cfg.encoder_layout == (
        (128, 128, (256, False)),
        (256, 256, (512, False)),
        (512, 512, (1024, True)),
        (1024, 1024, (1024, True)),
        (1024, 1024, None),
    )
    assert cfg.decoder_layout == (
        (1024, 1024, (1024, True)),
        (1024, 1024, (512, True)),
        (512, 512, (256, False)),
        (256, 256, (128, False)),
        (128, 128, None),
    )
    unmatched = HunyuanVideo15VAEConfig(downsample_match_channel=False)
    assert unmatched.encoder_layout[1] == (128, 256, (256, False))


def test_from_diffusers_config():
    cfg = from_diffusers_config(
        {
            "_class_name": "AutoencoderKLHunyuanVideo15",
            "latent_channels": 16,
            "block_out_channels": [8, 16, 16, 32, 32],
            "layers_per_block": 1,
            "scaling_factor": 1.5,
        }
    )
    assert (cfg.z_dim, cfg.block_out_channels, cfg.scaling_factor) == (16, (8, 16, 16, 32, 32), 1.5)
    with pytest.raises(ValueError, match="unknown"):
        from_diffusers_config({"latent_channel": 16})


def test_released_preset_size_axes_and_key_map_coverage():
    abstract = nnx.eval_shape(
        lambda: HunyuanVideo15VAE(PRESETS["hunyuanvideo15"], rngs=nnx.Rngs(0))
    )
    flat = flat_params(abstract)
    # diffusers' AutoencoderKLHunyuanVideo15() has 1,260,634,115 parameters.
    assert sum(int(np.prod(v.get_value().shape)) for v in flat.values()) == 1_260_634_115
    rules = key_map(PRESETS["hunyuanvideo15"])
    assert sorted(r.target for r in rules) == sorted(flat)
    assert len({r.source for r in rules}) == len(rules)
    for v in flat.values():
        axes = v.get_metadata().get("sharding") or v.get_metadata().get("out_sharding")
        assert axes is not None and set(axes) <= PARAM_AXES, axes


def test_registry_pairs_the_dits_with_these_vaes():
    tiny = get("hunyuanvideo1.5-tiny")
    assert get_vae(tiny.vae).config == TINY
    assert TINY.z_dim == hunyuan15.PRESETS["tiny"].latent_channels
    assert get_vae(get("hunyuanvideo1.5").vae).config == PRESETS["hunyuanvideo15"]
    assert get_vae(get("hunyuanvideo1.5").vae).module is HunyuanVideo15VAE


# ---------------------------------------------------------------- pixel (un)shuffle


def test_pack_and_unpack_are_inverse_in_diffusers_channel_order():
    x = jnp.arange(2 * 4 * 6 * 12, dtype=jnp.float32).reshape(1, 2, 4, 6, 12)
    packed = hv15_model._pack(x, 2)
    assert packed.shape == (1, 1, 2, 3, 96)
    np.testing.assert_array_equal(hv15_model._unpack(packed, 2), x)
    # Channel index ((dt * 2 + dy) * 2 + dx) * c + ch, as diffusers' view/permute gives.
    c = x.shape[-1]
    for dt, dy, dx in [(0, 0, 0), (1, 0, 1), (0, 1, 0), (1, 1, 1)]:
        k = ((dt * 2 + dy) * 2 + dx) * c
        np.testing.assert_array_equal(packed[0, 0, 1, 2, k : k + c], x[0, dt, 2 + dy, 4 + dx])


# ---------------------------------------------------------------- streaming

# 9 frames at 32x32 pixels <-> 3 latent frames at 2x2; batch 2 (diffusers' reference cannot
# batch this VAE, see tests/reference).
VIDEO = (2, 9, 32, 32, 3)
LATENTS = (2, 3, 2, 2, 16)


def test_decode_streams_causally(vae):
    z = latents(LATENTS)
    per_frame = vae.decode(z)  # latent frame 0, then one latent frame per scan step
    assert per_frame.shape == VIDEO and float(jnp.abs(per_frame).max()) <= 1.0
    assert float(jnp.mean(jnp.abs(per_frame) < 1)) > 0.5  # mostly unclamped, so comparable
    # Causality: the first 2 latent frames decode to the first 5 frames of all 3.
    np.testing.assert_allclose(vae.decode(z[:, :2]), per_frame[:, :5], rtol=0, atol=1e-5)
    assert float(jnp.abs(per_frame[:, 5:] - per_frame[:, 4:5]).max()) > 1e-3  # not constant


@pytest.mark.slow
def test_step_sizes_do_not_change_results(vae):
    z = latents(LATENTS)
    np.testing.assert_allclose(vae.decode(z, latents_per_step=2), vae.decode(z), atol=1e-5)


@pytest.mark.slow
def test_encode_streams_causally(vae):
    x = video(VIDEO)
    chunked = vae.encode(x)  # frame 0, then 4-frame chunks
    assert chunked.shape == LATENTS
    scale = float(jnp.abs(chunked).max())
    np.testing.assert_allclose(vae.encode(x, frames_per_step=8), chunked, atol=1e-5 * scale)
    np.testing.assert_allclose(vae.encode(x[:, :5]), chunked[:, :2], atol=1e-5 * scale)


def test_scan_traces_one_chunk_body_for_any_length(vae, monkeypatch):
    """The streamed decoder part is traced twice (frame 0 and the scan step) for any length."""
    assert_decoder_traced_once_per_chunk(vae, monkeypatch, hv15_model.Decoder, "stream", (1, 1, 16))


@pytest.mark.slow
def test_decode_memory_is_flat_in_frames(vae):
    graphdef, state = nnx.split(vae)

    def peak(t):
        fn = jax.jit(lambda s, z: nnx.merge(graphdef, s).decode_raw(z))
        mem = fn.lower(state, jnp.zeros((1, t, 4, 4, 16))).compile().memory_analysis()
        return mem.temp_size_in_bytes, mem.output_size_in_bytes

    (temp_short, out_short), (temp_long, out_long) = peak(3), peak(17)
    assert out_long / out_short == pytest.approx(65 / 9, rel=1e-6)
    # Only the output and the small latent-resolution stem grow; the scan holds one chunk.
    assert temp_long <= 1.1 * temp_short + 2 * out_long, (temp_short, temp_long, out_long)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((1, 8, 32, 32, 3), "1 \\+ 4k frames"),
        ((1, 9, 24, 32, 3), "multiples of 16"),
        ((1, 9, 32, 32, 1), "1 channels, expected 3"),
    ],
)
def test_encode_rejects_bad_video(vae, shape, match):
    with pytest.raises(ValueError, match=match):
        vae.encode(jnp.zeros(shape))


def test_bad_latents_steps_and_tiles_raise(vae):
    with pytest.raises(ValueError, match="expected z_dim=16"):
        vae.decode(jnp.zeros((1, 2, 2, 2, 32)))
    with pytest.raises(ValueError, match="latents_per_step=2"):
        vae.decode(jnp.zeros((1, 4, 2, 2, 16)), latents_per_step=2)
    with pytest.raises(ValueError, match="frames_per_step=6"):
        vae.encode(jnp.zeros((1, 9, 16, 16, 3)), frames_per_step=6)
    with pytest.raises(ValueError, match="frames=None"):
        vae.decode(jnp.zeros((1, 2, 2, 2, 16)), tiling=Tiling())
    assert NO_TILING.size is None


# ---------------------------------------------------------------- checkpoints


def test_save_load_round_trip_and_corrupt_checkpoints(vae, tmp_path):
    save(vae, tmp_path / "vae.safetensors")
    loaded = load(tmp_path / "vae.safetensors", "hunyuanvideo15-tiny")
    want, got = flat_params(vae), flat_params(loaded)
    assert sorted(want) == sorted(got)
    for key in want:
        np.testing.assert_array_equal(want[key].get_value(), got[key].get_value(), err_msg=key)

    tensors = export_state(nnx.state(vae, nnx.Param), key_map(TINY))
    key = "decoder.up_blocks.0.upsamplers.0.conv.conv.weight"
    assert tensors[key].shape == (32 * 8, 32, 3, 3, 3)  # torch layout, 8x channels (time)
    save_file(dict(tensors, **{key: tensors[key][:128]}), tmp_path / "shape.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load(tmp_path / "shape.safetensors", TINY)
    with pytest.raises(ValueError, match="unknown HunyuanVideo15VAE preset"):
        load(tmp_path / "vae.safetensors", "tiny")


# ---------------------------------------------------------------- pipeline


@pytest.mark.slow
def test_generate_end_to_end_from_a_diffusers_folder(tmp_path):
    spec = get("hunyuanvideo1.5-tiny")
    (tmp_path / "transformer").mkdir()
    (tmp_path / "vae").mkdir()
    dit = hunyuan15.HunyuanVideo15Transformer(spec.config, rngs=nnx.Rngs(0))
    save_model(
        dit,
        tmp_path / "transformer" / "diffusion_pytorch_model.safetensors",
        hunyuan15.key_map(spec.config),
    )
    vae = HunyuanVideo15VAE(TINY, rngs=nnx.Rngs(1))
    save(vae, tmp_path / "vae" / "diffusion_pytorch_model.safetensors")

    video = vidax.pipeline.generate(
        "hunyuanvideo1.5-tiny",
        prompt="a red ball rolls",
        checkpoint=tmp_path,
        steps=2,
        num_frames=5,
        height=32,
        width=32,
    )
    assert video.latents.shape == (1, 2, 2, 2, 16)
    assert video.frames.shape == (5, 32, 32, 3)
    want = vidax.pipeline.decode(vae, jnp.asarray(video.latents))[0]
    np.testing.assert_allclose(video.frames, want, atol=1e-5)
    assert float(video.frames.std()) > 0.01
