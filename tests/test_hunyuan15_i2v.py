"""HunyuanVideo-1.5 image-to-video without torch (issue 21, item 2): its condition and image
tokens, its presets, its checkpoint's image encoder, and the command line on the tiny
random-weight preset (diffusers parity: tests/reference/test_hunyuan15_i2v_parity.py)."""

import json
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image
from typer.testing import CliRunner

from vidax import pipeline
from vidax.checkpoint import CheckpointError, export_state, save_file
from vidax.cli import app
from vidax.models import hunyuan15, pretrained, siglip_vision
from vidax.models.registry import get
from vidax.models.weights import RandomWeightsWarning, load_image_encoder
from vidax.video import image_pixels

TINY = "hunyuanvideo1.5-i2v-tiny"
IMAGE = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)


def test_condition_is_the_image_latent_on_frame_zero_then_a_mask():
    config = get(TINY).config  # 16 latent channels: 16 + 16 + 1 = 33 input channels
    calls = []

    def encode(video):  # (b, F, H, W, 3) -> (b, t, H/16, W/16, 16), t = 1 + (F - 1) / 4
        calls.append(video.shape)
        b, f, h, w, _ = video.shape
        return jnp.full((b, 1 + (f - 1) // 4, h // 16, w // 16, 16), 7.0) + video[:, :1, :1, :1, :1]

    pixels = jnp.linspace(-1, 1, 2 * 32 * 48 * 3).reshape(2, 32, 48, 3)
    condition = hunyuan15.image_condition(config, encode, pixels, 9, 3)
    assert calls == [(2, 1, 32, 48, 3)]  # the image alone, not a video of it
    assert condition.shape == (2, 3, 2, 3, 17)
    # diffusers' [latents, cond_latents, mask]: the condition is [image latents, mask].
    np.testing.assert_allclose(condition[:, 0, ..., :16], encode(pixels[:, None])[:, 0])
    np.testing.assert_array_equal(condition[:, 1:, ..., :16], 0.0)
    np.testing.assert_array_equal(condition[:, 0, ..., 16], 1.0)
    np.testing.assert_array_equal(condition[:, 1:, ..., 16], 0.0)
    wrong = lambda video: encode(video)[..., :8]
    with pytest.raises(ValueError, match="8 latent channels and a mask are not the model's 17"):
        hunyuan15.image_condition(config, wrong, pixels, 9, 3)


def test_image_tokens_are_siglips_last_hidden_state():
    encoder = siglip_vision.SiglipVisionEncoder(
        siglip_vision.PRESETS["siglip-tiny"], rngs=nnx.Rngs(0)
    )
    pixels = jnp.asarray(encoder.preprocess(IMAGE[None]))
    tokens = hunyuan15.image_tokens(get(TINY).config, encoder, pixels)
    np.testing.assert_array_equal(tokens, encoder(pixels))
    assert hunyuan15.image_inputs(get(TINY).config, tokens) == {"image_embeds": tokens}
    with pytest.raises(ValueError, match="reads image-encoder tokens"):
        hunyuan15.image_inputs(get(TINY).config, None)


def test_the_encoder_sees_the_first_frame_at_the_video_size():
    # As diffusers, which resizes the image to the video before SigLIP reads it: an image and
    # its resized copy give the same tokens (and the same condition).
    spec = get(TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        encoder = load_image_encoder(spec, None, random_weights=True)
    vae = spec.vae_spec.build(seed=0)
    resized = np.round((image_pixels(IMAGE, 32, 48)[0] + 1) * 127.5).astype(np.uint8)
    a = pipeline.image_conditioning(spec, IMAGE, vae, encoder, 5, 32, 48, 2)
    b = pipeline.image_conditioning(spec, resized, vae, encoder, 5, 32, 48, 2)
    assert a["image_embeds"].shape == (2, 16, 32)  # a 4 x 4 patch grid of the tiny SigLIP
    np.testing.assert_allclose(a["image_embeds"], b["image_embeds"], atol=1e-6)
    np.testing.assert_allclose(a["condition"], b["condition"], atol=1e-6)


def test_presets():
    real, tiny = get("hunyuanvideo1.5-i2v"), get(TINY)
    assert (real.task, real.image_encoder, real.vae_name) == (
        "i2v",
        "siglip-so400m-patch14-384",
        "hunyuanvideo15",
    )
    d = real.defaults
    assert (d.num_frames, d.height, d.width, d.steps, d.guidance, d.shift, d.sampler) == (
        121,
        480,
        848,
        50,
        6.0,
        5.0,
        "euler",
    )
    assert real.config == get("hunyuanvideo1.5").config  # the T2V transformer's shape
    for spec in (real, tiny):
        encoder = spec.image_encoder_spec
        assert encoder.family == "siglip"
        assert encoder.config.hidden_size == spec.config.image_dim
        assert encoder.config.num_tokens == spec.config.image_len
        assert spec.config.condition_channels == spec.config.out_channels + 1


def _write(path, config: dict, name: str = "config.json"):
    path.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(json.dumps(config))


def test_pipeline_index_names_the_siglip_encoder(tmp_path):
    root = tmp_path / "p"
    config = hunyuan15.to_diffusers_config(get("hunyuanvideo1.5-tiny").config)
    _write(root / "transformer", {"_class_name": "HunyuanVideo15Transformer3DModel", **config})
    index = {
        "_class_name": "HunyuanVideo15ImageToVideoPipeline",
        "transformer": ["diffusers", "HunyuanVideo15Transformer3DModel"],
        "image_encoder": ["transformers", "SiglipVisionModel"],
    }
    _write(root, index, "model_index.json")
    spec = pretrained.spec_from_checkpoint(root)
    assert (spec.family, spec.task, spec.image_encoder) == (
        "hunyuanvideo15",
        "i2v",
        "siglip-so400m-patch14-384",
    )
    _write(root, {**index, "image_encoder": ["transformers", "Dinov2Model"]}, "model_index.json")
    with pytest.raises(CheckpointError, match="image encoder 'Dinov2Model' is not one vidax"):
        pretrained.spec_from_checkpoint(root)


def test_the_image_encoder_class_comes_from_its_config(tmp_path):
    # The spec names a preset; the checkpoint's image_encoder/config.json says what it holds.
    config = siglip_vision.SiglipVisionConfig(
        hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=4,
        image_size=28, patch_size=7,
    )  # fmt: skip
    model = siglip_vision.SiglipVisionEncoder(config, rngs=nnx.Rngs(3))
    folder = tmp_path / "image_encoder"
    folder.mkdir()
    tensors = export_state(nnx.state(model, nnx.Param), siglip_vision.key_map(config, prefix=""))
    save_file(tensors, folder / "model.safetensors")
    hf = {"architectures": ["SiglipVisionModel"], "model_type": "siglip_vision_model"}
    hf |= {k: getattr(config, k) for k in ("hidden_size", "intermediate_size", "image_size")}
    hf |= {"num_hidden_layers": 1, "num_attention_heads": 4, "patch_size": 7}
    _write(folder, hf)
    loaded = load_image_encoder(get(TINY), tmp_path)
    assert isinstance(loaded, siglip_vision.SiglipVisionEncoder) and loaded.config == config
    pixels = jnp.asarray(loaded.preprocess(IMAGE[None]))
    np.testing.assert_array_equal(loaded(pixels), model(pixels))
    _write(folder, {**hf, "architectures": ["Dinov2Model"]})
    with pytest.raises(CheckpointError, match="image encoder 'Dinov2Model' is not one vidax runs"):
        load_image_encoder(get(TINY), tmp_path)


# -- command line ----------------------------------------------------------------------------------

runner = CliRunner()
SMALL = ["--frames", "5", "--height", "32", "--width", "48", "--steps", "2"]


def _png(tmp_path):
    path = tmp_path / "first.png"
    Image.fromarray(IMAGE).save(path)
    return path


def test_generate_image_to_video_on_random_weights(tmp_path):
    out = tmp_path / "o.npz"
    args = ["generate", "--model", TINY, "--prompt", "a red circle", "--image", str(_png(tmp_path))]
    result = runner.invoke(app, [*args, *SMALL, "--random-weights", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "image encoder" in result.output  # the random-weights warning names it
    video = dict(np.load(out))
    assert video["frames"].shape == (5, 32, 48, 3) and video["latents"].shape == (1, 2, 2, 3, 16)
    assert np.isfinite(video["latents"]).all()


@pytest.mark.parametrize(
    "model, image, message",
    [
        (
            "hunyuanvideo1.5-tiny",
            True,
            "'hunyuanvideo1.5-tiny' is text-to-video: it takes no image",
        ),
        (TINY, False, f"model {TINY!r} is image-to-video: pass an image (--image FILE)"),
    ],
)
def test_the_task_decides_whether_an_image_is_taken(tmp_path, model, image, message):
    out = tmp_path / "o.npz"
    args = ["generate", "--model", model, "--prompt", "x", *SMALL, "--random-weights"]
    args += ["--image", str(_png(tmp_path))] if image else []
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not out.exists()
