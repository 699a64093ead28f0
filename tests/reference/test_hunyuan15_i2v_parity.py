"""HunyuanVideo-1.5 image-to-video end to end against diffusers (issue 21, item 2): a tiny
`HunyuanVideo15ImageToVideoPipeline` (random transformer, VAE and SigLIP image encoder) written by
`save_pretrained` runs through `vidax generate --checkpoint DIR --image FILE --prompt-embeds FILE`
with no model flags, then through diffusers from the same initial noise and image. The text
encoders (Qwen2.5-VL, ByT5) are not ported: prompt embeddings come from a file, as in the
text-to-video test (tests/reference/test_pipeline_parity.py)."""

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.reference._torch import assert_close

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from vidax.cli import app  # noqa: E402
from vidax.models import hunyuan15, hunyuan15_vae, pretrained  # noqa: E402
from vidax.models.hunyuan15 import HunyuanVideo15Config  # noqa: E402

pytestmark = pytest.mark.reference

# A 32 x 48 image: diffusers picks the video size from the image (the bucket of the transformer's
# target_size nearest its aspect ratio), which target_size 48 makes the image's own size, so
# neither pipeline resizes it. Not square, so a height / width mix-up cannot pass.
FRAMES, HEIGHT, WIDTH, STEPS = 5, 32, 48, 4
SIGLIP = dict(
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=30,  # 30 // 7 = 4 patches a side, as so400m's 384 // 14 leaves a remainder
    patch_size=7,
)
HUNYUAN15 = HunyuanVideo15Config(
    num_heads=2,
    head_dim=16,
    num_layers=1,
    num_refiner_layers=1,
    mlp_ratio=2.0,
    in_channels=9,  # 4 latent + 4 image latent + 1 mask
    out_channels=4,
    text_dim=24,
    byt5_dim=12,
    image_dim=SIGLIP["hidden_size"],
    rope_axes_dims=(4, 6, 6),
    dtype="float32",
    param_dtype="float32",
)
VAE = hunyuan15_vae.HunyuanVideo15VAEConfig(
    z_dim=4, block_out_channels=(8, 8, 16, 16, 16), layers_per_block=1
)


def _randomise(model, scale: float, seed: int = 0):
    # diffusers zero-initialises some projections and gates: randomise every weight.
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    from diffusers.guiders import ClassifierFreeGuidance

    root = tmp_path_factory.mktemp("hunyuan15-i2v-pipeline")
    transformer = diffusers.HunyuanVideo15Transformer3DModel(
        **hunyuan15.to_diffusers_config(HUNYUAN15), target_size=WIDTH
    )
    _randomise(transformer, 0.1)
    with torch.no_grad():  # keep the 2048-wide ByT5 MLP's outputs at the others' scale
        for p in transformer.context_embedder_2.parameters():
            p.mul_(0.1)
    encoder = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**SIGLIP))
    # transformers 5 without torchvision falls back to the PIL backend (vidax's resize).
    processor = getattr(transformers, "SiglipImageProcessorPil", transformers.SiglipImageProcessor)
    size = SIGLIP["image_size"]
    pipe = diffusers.HunyuanVideo15ImageToVideoPipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
        vae=diffusers.AutoencoderKLHunyuanVideo15(**hunyuan15_vae.to_diffusers_config(VAE)),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder_2=None,
        tokenizer_2=None,
        guider=ClassifierFreeGuidance(guidance_scale=4.5),
        image_encoder=_randomise(encoder, 0.2, seed=1),
        feature_extractor=processor(size={"height": size, "width": size}),
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def _image(path, seed: int = 0):
    # Smooth, so the VAE's input is an image rather than noise.
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((WIDTH, HEIGHT), Image.Resampling.BILINEAR)
    image.save(path)
    return Image.open(path).convert("RGB")


def _prompt_embeds(path):
    import safetensors.numpy

    rng = np.random.default_rng(1)
    embeds = rng.standard_normal((2, 1, 9, HUNYUAN15.text_dim)).astype(np.float32)
    masks = np.stack([np.arange(9)[None] < 6, np.arange(9)[None] < 3]).astype(np.float32)
    safetensors.numpy.save_file(
        {
            "prompt_embeds": embeds[0],
            "prompt_mask": masks[0],
            "negative_prompt_embeds": embeds[1],
            "negative_prompt_mask": masks[1],
        },
        path,
    )
    # No glyph (ByT5) tokens: an all-False mask in diffusers, none in vidax.
    glyphs = torch.zeros(1, 4, HUNYUAN15.byt5_dim)
    no_glyphs = torch.zeros(1, 4, dtype=torch.int64)
    return dict(
        prompt_embeds=torch.from_numpy(embeds[0]),
        prompt_embeds_mask=torch.from_numpy(masks[0]).long(),
        negative_prompt_embeds=torch.from_numpy(embeds[1]),
        negative_prompt_embeds_mask=torch.from_numpy(masks[1]).long(),
        prompt_embeds_2=glyphs,
        prompt_embeds_mask_2=no_glyphs,
        negative_prompt_embeds_2=glyphs,
        negative_prompt_embeds_mask_2=no_glyphs,
    )


def _cli(tmp_path, root, image, embeds) -> dict:
    out = tmp_path / "x.npz"
    args = ["generate", "--checkpoint", str(root), "--prompt-embeds", str(embeds)]
    args += ["--image", str(image), "--frames", str(FRAMES), "--height", str(HEIGHT)]
    args += ["--width", str(WIDTH), "--steps", str(STEPS), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return dict(np.load(out))


def test_hunyuan15_i2v_pipeline_matches_diffusers(pipeline, tmp_path):
    pipe, root = pipeline
    image = _image(tmp_path / "first.png")
    kwargs = _prompt_embeds(tmp_path / "prompt.safetensors")
    ours = _cli(tmp_path, root, tmp_path / "first.png", tmp_path / "prompt.safetensors")
    noise = ours["noise"]
    assert noise.shape == (1, 2, HEIGHT // 16, WIDTH // 16, 4)
    kwargs.update(
        image=image,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        latents=torch.from_numpy(np.ascontiguousarray(noise.transpose(0, 4, 1, 2, 3))),
    )
    # This pipeline takes no step callback: the latents come from a second run.
    latents = pipe(**kwargs, output_type="latent").frames
    want = pipe(**kwargs, output_type="np").frames
    assert_close(ours["latents"], latents.permute(0, 2, 3, 4, 1).numpy(), 1e-4, "final latents")
    assert_close(ours["frames"], want[0], 1e-4, "frames")
    # The image steers the video: another first frame, another video.
    _image(tmp_path / "other.png", seed=5)
    other = _cli(tmp_path, root, tmp_path / "other.png", tmp_path / "prompt.safetensors")
    assert np.abs(other["latents"] - ours["latents"]).max() > 1e-2


def test_hunyuan15_i2v_spec_comes_from_the_configs(pipeline):
    _, root = pipeline
    spec = pretrained.spec_from_checkpoint(root)
    assert (spec.family, spec.task) == ("hunyuanvideo15", "i2v")
    assert spec.image_encoder == "siglip-so400m-patch14-384"  # the class's preset: a name only
    assert spec.config == HUNYUAN15
    assert (spec.defaults.guidance, spec.defaults.shift) == (4.5, 5.0)
