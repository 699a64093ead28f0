"""Wan image-to-video and Wan 2.2 pipelines written by diffusers' `save_pretrained` load from
their own configs and match diffusers end to end (issue 21): `vidax generate --checkpoint DIR
[--image FILE]` against diffusers' `WanImageToVideoPipeline` (Wan 2.1 I2V with CLIP; Wan 2.2
TI2V's `expand_timesteps`) and `WanPipeline` with two experts (Wan 2.2 A14B), from the same
initial noise."""

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.reference._torch import assert_close, train_sentencepiece

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from PIL import Image  # noqa: E402

from vidax import pipeline  # noqa: E402
from vidax.cli import app  # noqa: E402
from vidax.models import pretrained, wan, wan_vae  # noqa: E402
from vidax.models.wan import WanConfig  # noqa: E402

pytestmark = pytest.mark.reference

FRAMES, HEIGHT, WIDTH, STEPS = 5, 32, 32, 4
PROMPT = "a red cube rolls over a blue sphere"
# Wan's image-to-video attention splits its context assuming 512 text tokens.
BASE = dict(
    dim=32,
    num_layers=2,
    num_heads=2,
    ffn_dim=48,
    text_dim=24,
    dtype="float32",
    param_dtype="float32",
)
CLIP = dict(
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    patch_size=8,
)


def _randomise(model, scale: float, seed: int = 0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def text_parts(tmp_path_factory):
    tokenizer_dir = train_sentencepiece(tmp_path_factory.mktemp("spm"))
    tokenizer = transformers.T5TokenizerFast(vocab_file=str(tokenizer_dir / "spiece.model"))
    encoder = transformers.UMT5EncoderModel(
        transformers.UMT5Config(
            vocab_size=64, d_model=24, d_kv=8, d_ff=40, num_layers=2, num_heads=3, dropout_rate=0
        )
    )
    return dict(tokenizer=tokenizer, text_encoder=_randomise(encoder, 0.3))


def _scheduler():
    return diffusers.UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
    )


def _transformer(config: WanConfig, seed: int):
    return _randomise(diffusers.WanTransformer3DModel(**wan.to_diffusers_config(config)), 0.1, seed)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A smooth first frame at the video size (no resize on either side)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH] / max(HEIGHT, WIDTH)
    rgb = np.stack([x, y, 1 - x * y], -1)
    path = tmp_path_factory.mktemp("image") / "first.png"
    Image.fromarray((rgb * 255).astype(np.uint8)).save(path)
    return path


def _cli(tmp_path, root, *args) -> dict:
    out = tmp_path / "x.npz"
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--checkpoint",
            str(root),
            "--prompt",
            PROMPT,
            *args,
            "--frames",
            str(FRAMES),
            "--height",
            str(HEIGHT),
            "--width",
            str(WIDTH),
            "--steps",
            str(STEPS),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    return dict(np.load(out))


def _reference_latents(pipe, ours, **kwargs) -> np.ndarray:
    """diffusers' final latents (after what the pipeline writes in) from vidax's noise."""
    noise = torch.from_numpy(np.ascontiguousarray(ours["noise"].transpose(0, 4, 1, 2, 3)))
    out = pipe(
        prompt=PROMPT,
        negative_prompt="",
        num_frames=FRAMES,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=STEPS,
        latents=noise,
        output_type="latent",
        **kwargs,
    ).frames
    return out.float().permute(0, 2, 3, 4, 1).numpy()


# -- Wan 2.1 image-to-video: CLIP tokens + [mask, image latents] ---------------------------------

I2V = WanConfig(**BASE, in_channels=12, out_channels=4, image_dim=24, added_kv_proj_dim=32)


@pytest.fixture(scope="module")
def i2v_pipeline(tmp_path_factory, text_parts):
    root = tmp_path_factory.mktemp("wan-i2v")
    vision = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**CLIP))
    pipe = diffusers.WanImageToVideoPipeline(
        **text_parts,
        vae=diffusers.AutoencoderKLWan(**wan_vae.to_diffusers_config(wan_vae.PRESETS["tiny"])),
        scheduler=_scheduler(),
        transformer=_transformer(I2V, 1),
        image_encoder=_randomise(vision, 0.2, 2),
        image_processor=transformers.CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def test_wan_i2v_pipeline_matches_diffusers(i2v_pipeline, image, tmp_path):
    pipe, root = i2v_pipeline
    spec = pretrained.spec_from_checkpoint(root)
    assert (spec.task, spec.image_encoder, spec.config) == ("i2v", "clip-vit-h-14", I2V)
    ours = _cli(tmp_path, root, "--image", str(image))
    want = _reference_latents(pipe, ours, image=Image.open(image), guidance_scale=5.0)
    assert_close(ours["latents"], want, 1e-4, "wan i2v final latents")
    # The image matters: another first frame gives another video.
    other = tmp_path / "other.png"
    Image.fromarray(255 - np.asarray(Image.open(image))).save(other)
    moved = _cli(tmp_path, root, "--image", str(other))
    assert np.abs(moved["latents"] - ours["latents"]).max() > 1e-3


def test_an_i2v_model_needs_an_image(i2v_pipeline, tmp_path):
    _, root = i2v_pipeline
    result = CliRunner().invoke(
        app, ["generate", "--checkpoint", str(root), "--prompt", PROMPT, "--out", "x.mp4"]
    )
    assert result.exit_code == 2
    assert "is image-to-video: pass an image (--image FILE)" in result.output


# -- Wan 2.2 A14B: two experts switched at boundary_ratio, a guidance scale each ----------------

T2V = WanConfig(**BASE, in_channels=4, out_channels=4)


@pytest.fixture(scope="module")
def experts_pipeline(tmp_path_factory, text_parts):
    root = tmp_path_factory.mktemp("wan-a14b")
    pipe = diffusers.WanPipeline(
        **text_parts,
        vae=diffusers.AutoencoderKLWan(**wan_vae.to_diffusers_config(wan_vae.PRESETS["tiny"])),
        scheduler=_scheduler(),
        transformer=_transformer(T2V, 3),
        transformer_2=_transformer(T2V, 4),
        boundary_ratio=0.875,
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def test_wan22_two_experts_match_diffusers(experts_pipeline, tmp_path):
    pipe, root = experts_pipeline
    spec = pretrained.spec_from_checkpoint(root)
    assert spec.boundary_ratio == 0.875 and spec.task == "t2v"
    # shift 3, 4 steps: timesteps 1000, 900 | 750, 500: two steps for each expert.
    ours = _cli(tmp_path, root, "--guidance", "4", "--guidance-2", "2.5")
    want = _reference_latents(pipe, ours, guidance_scale=4.0, guidance_scale_2=2.5)
    assert_close(ours["latents"], want, 1e-4, "wan 2.2 experts final latents")
    # The low-noise expert takes part: the high-noise one alone gives another video.
    single = dataclasses.replace(spec, boundary_ratio=None)
    alone = pipeline.generate(
        single,
        PROMPT,
        checkpoint=root,
        num_frames=FRAMES,
        height=HEIGHT,
        width=WIDTH,
        steps=STEPS,
        guidance=4.0,
        decode_frames=False,
    )
    assert np.abs(alone.latents - ours["latents"]).max() > 1e-2


# -- Wan 2.2 TI2V: the image's latent replaces the first frame, held at t = 0 -------------------

TI2V = WanConfig(**BASE, in_channels=4, out_channels=4)


@pytest.fixture(scope="module")
def ti2v_pipeline(tmp_path_factory, text_parts):
    root = tmp_path_factory.mktemp("wan-ti2v")
    vae = diffusers.AutoencoderKLWan(**wan_vae.to_diffusers_config(wan_vae.PRESETS["wan2.2-tiny"]))
    pipe = diffusers.WanImageToVideoPipeline(
        **text_parts,
        vae=_randomise(vae, 0.2, 5),
        scheduler=_scheduler(),
        transformer=_transformer(TI2V, 6),
        image_encoder=None,
        image_processor=None,
        expand_timesteps=True,
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def test_wan22_ti2v_matches_diffusers(ti2v_pipeline, image, tmp_path):
    pipe, root = ti2v_pipeline
    spec = pretrained.spec_from_checkpoint(root)
    assert spec.task == "ti2v" and spec.config.expand_timesteps and spec.image_encoder is None
    ours = _cli(tmp_path, root, "--image", str(image))
    want = _reference_latents(pipe, ours, image=Image.open(image), guidance_scale=5.0)
    assert_close(ours["latents"], want, 1e-4, "wan 2.2 ti2v final latents")
    # The first latent frame is the image's own latent, untouched by sampling.
    text_only = _cli(tmp_path, root)
    assert np.abs(text_only["latents"][:, 0] - ours["latents"][:, 0]).max() > 1e-3
