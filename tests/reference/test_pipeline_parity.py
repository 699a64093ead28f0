"""Whole pipelines written by diffusers' `save_pretrained` load from their own configs and match
diffusers end to end: `vidax generate --checkpoint DIR --out x.npz` with no model flags, then
the diffusers pipeline from the same initial noise (issue 20, item 1)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.reference._torch import assert_close, train_sentencepiece

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from vidax.cli import app  # noqa: E402
from vidax.models import (  # noqa: E402
    hunyuan,
    hunyuan15,
    hunyuan15_vae,
    hunyuan_vae,
    pretrained,
    registry,
    wan,
    wan_vae,
)
from vidax.models.hunyuan import HunyuanVideoConfig  # noqa: E402
from vidax.models.hunyuan15 import HunyuanVideo15Config  # noqa: E402
from vidax.models.wan import WanConfig  # noqa: E402

pytestmark = pytest.mark.reference

FRAMES, HEIGHT, WIDTH, STEPS = 5, 32, 32, 4
PROMPT = "a red cube rolls over a blue sphere"


def _randomise(model, scale: float, seed: int = 0):
    # diffusers zero-initialises some projections and gates: randomise every weight.
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return model.eval()


def _run_cli(tmp_path, *args) -> dict:
    out = tmp_path / "x.npz"
    result = CliRunner().invoke(
        app,
        [
            "generate",
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


def _latents(x: np.ndarray):
    """vidax (b, t, h, w, c) -> diffusers (b, c, t, h, w)."""
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3)))


class _LastLatents:
    """A `callback_on_step_end` keeping the latents after the last step."""

    def __call__(self, pipe, step, timestep, kwargs):
        self.latents = kwargs["latents"].detach().float().permute(0, 2, 3, 4, 1).numpy()
        return {}


# -- Wan 2.1: transformer, VAE, umT5 + tokenizer, UniPC --------------------------------------------

WAN = WanConfig(
    dim=32,
    num_layers=2,
    num_heads=2,
    ffn_dim=48,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    dtype="float32",  # as stored: the configs say nothing of dtypes, the weights do
    param_dtype="float32",
)


@pytest.fixture(scope="module")
def wan_pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan-pipeline")
    tokenizer_dir = train_sentencepiece(tmp_path_factory.mktemp("spm"))
    tokenizer = transformers.T5TokenizerFast(vocab_file=str(tokenizer_dir / "spiece.model"))
    encoder = transformers.UMT5EncoderModel(
        transformers.UMT5Config(
            vocab_size=64, d_model=24, d_kv=8, d_ff=40, num_layers=2, num_heads=3, dropout_rate=0
        )
    )
    pipe = diffusers.WanPipeline(
        tokenizer=tokenizer,
        text_encoder=_randomise(encoder, 0.3),
        vae=diffusers.AutoencoderKLWan(**wan_vae.to_diffusers_config(wan_vae.PRESETS["tiny"])),
        scheduler=diffusers.UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
        transformer=_randomise(
            diffusers.WanTransformer3DModel(**wan.to_diffusers_config(WAN)), 0.1
        ),
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def test_wan_pipeline_matches_diffusers(wan_pipeline, tmp_path):
    pipe, root = wan_pipeline
    ours = _run_cli(tmp_path, "--checkpoint", str(root), "--prompt", PROMPT)
    last = _LastLatents()
    want = pipe(
        prompt=PROMPT,
        negative_prompt="",
        num_frames=FRAMES,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=STEPS,
        guidance_scale=5.0,  # the wan2.1-1.3b preset's default: the checkpoint does not say
        latents=_latents(ours["noise"]),
        output_type="np",
        callback_on_step_end=last,
    ).frames
    assert_close(ours["latents"], last.latents, 1e-4, "final latents")
    assert_close(ours["frames"], want[0], 1e-4, "frames")
    assert np.ptp(ours["frames"]) > 0.05  # a video, not a constant


def test_wan_spec_comes_from_the_configs(wan_pipeline):
    _, root = wan_pipeline
    spec = pretrained.spec_from_checkpoint(root)
    assert spec.config == WAN  # text_len 512: the base preset's
    assert spec.vae_spec.config == wan_vae.from_diffusers_config(
        json.loads((root / "vae" / "config.json").read_text())
    )
    assert spec.vae_spec.path == root / "vae"
    d = spec.defaults
    assert (d.sampler, d.shift, dict(d.solver_options)["order"]) == ("unipc", 3.0, 2)
    # A preset name is only the default for what the configs do not say.
    assert pretrained.spec_from_checkpoint(root, registry.get("wan2.1-14b")).config == spec.config


def test_vae_and_text_encoder_overrides(wan_pipeline, tmp_path):
    """--vae and --text-encoder point one component elsewhere: the same files give the same
    video as the pipeline folder does."""
    _, root = wan_pipeline
    (tmp_path / "transformer").symlink_to(root / "transformer")
    ours = _run_cli(tmp_path, "--checkpoint", str(root), "--prompt", PROMPT)
    moved = _run_cli(
        tmp_path,
        "--checkpoint",
        str(tmp_path / "transformer"),
        "--vae",
        str(root / "vae"),
        "--text-encoder",
        str(root / "text_encoder"),
        "--prompt",
        PROMPT,
    )
    np.testing.assert_array_equal(moved["frames"], ours["frames"])


# -- HunyuanVideo: transformer, VAE, Euler; prompt embeddings from a file ---------------------------

HUNYUAN = HunyuanVideoConfig(
    num_heads=2,
    head_dim=16,
    num_layers=1,
    num_single_layers=1,
    num_refiner_layers=1,
    mlp_ratio=2.0,
    in_channels=4,
    out_channels=4,
    text_dim=24,
    pooled_dim=20,
    rope_axes_dims=(4, 6, 6),
    dtype="float32",
    param_dtype="float32",
)
HUNYUAN_VAE = hunyuan_vae.HunyuanVideoVAEConfig(
    z_dim=4, block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4
)


@pytest.fixture(scope="module")
def hunyuan_pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("hunyuan-pipeline")
    vae_kwargs = hunyuan_vae.to_diffusers_config(HUNYUAN_VAE)
    pipe = diffusers.HunyuanVideoPipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=_randomise(
            diffusers.HunyuanVideoTransformer3DModel(**hunyuan.to_diffusers_config(HUNYUAN)), 0.1
        ),
        vae=diffusers.AutoencoderKLHunyuanVideo(**vae_kwargs),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder_2=None,
        tokenizer_2=None,
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def test_hunyuan_pipeline_matches_diffusers(hunyuan_pipeline, tmp_path):
    import safetensors.numpy

    pipe, root = hunyuan_pipeline
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((1, 9, HUNYUAN.text_dim)).astype(np.float32)
    mask = np.arange(9)[None] < 6
    pooled = rng.standard_normal((1, HUNYUAN.pooled_dim)).astype(np.float32)
    safetensors.numpy.save_file(
        {
            "prompt_embeds": embeds,
            "prompt_mask": mask.astype(np.float32),
            "pooled_prompt_embeds": pooled,
        },
        tmp_path / "prompt.safetensors",
    )
    ours = _run_cli(
        tmp_path, "--checkpoint", str(root), "--prompt-embeds", str(tmp_path / "prompt.safetensors")
    )
    last = _LastLatents()
    want = pipe(
        prompt_embeds=torch.from_numpy(embeds),
        prompt_attention_mask=torch.from_numpy(mask.astype(np.int64)),
        pooled_prompt_embeds=torch.from_numpy(pooled),
        num_frames=FRAMES,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=STEPS,
        guidance_scale=6.0,  # the hunyuanvideo preset's default (embedded guidance)
        latents=_latents(ours["noise"]),
        output_type="np",
        callback_on_step_end=last,
    ).frames
    assert_close(ours["latents"], last.latents, 1e-4, "final latents")
    assert_close(ours["frames"], want[0], 1e-4, "frames")


# -- HunyuanVideo-1.5: transformer, VAE, Euler, CFG guider; embeddings from a file -----------------

HUNYUAN15 = HunyuanVideo15Config(
    num_heads=2,
    head_dim=16,
    num_layers=1,
    num_refiner_layers=1,
    mlp_ratio=2.0,
    in_channels=9,
    out_channels=4,
    text_dim=24,
    byt5_dim=12,
    image_dim=10,
    rope_axes_dims=(4, 6, 6),
    dtype="float32",
    param_dtype="float32",
)
HUNYUAN15_VAE = hunyuan15_vae.HunyuanVideo15VAEConfig(
    z_dim=4, block_out_channels=(8, 8, 16, 16, 16), layers_per_block=1
)


@pytest.fixture(scope="module")
def hunyuan15_pipeline(tmp_path_factory):
    from diffusers.guiders import ClassifierFreeGuidance

    root = tmp_path_factory.mktemp("hunyuan15-pipeline")
    transformer = diffusers.HunyuanVideo15Transformer3DModel(
        **hunyuan15.to_diffusers_config(HUNYUAN15)
    )
    _randomise(transformer, 0.1)
    with torch.no_grad():  # keep the 2048-wide ByT5 MLP's outputs at the others' scale
        for p in transformer.context_embedder_2.parameters():
            p.mul_(0.1)
    pipe = diffusers.HunyuanVideo15Pipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
        vae=diffusers.AutoencoderKLHunyuanVideo15(
            **hunyuan15_vae.to_diffusers_config(HUNYUAN15_VAE)
        ),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder_2=None,
        tokenizer_2=None,
        guider=ClassifierFreeGuidance(guidance_scale=4.5),
    )
    pipe.save_pretrained(root, safe_serialization=True)
    return pipe, root


def test_hunyuan15_pipeline_matches_diffusers(hunyuan15_pipeline, tmp_path):
    import safetensors.numpy

    pipe, root = hunyuan15_pipeline
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
        tmp_path / "prompt.safetensors",
    )
    ours = _run_cli(
        tmp_path, "--checkpoint", str(root), "--prompt-embeds", str(tmp_path / "prompt.safetensors")
    )
    # No glyph (ByT5) tokens: an all-False mask in diffusers, none in vidax.
    glyphs = torch.zeros(1, 4, HUNYUAN15.byt5_dim)
    no_glyphs = torch.zeros(1, 4, dtype=torch.int64)
    kwargs = dict(
        prompt_embeds=torch.from_numpy(embeds[0]),
        prompt_embeds_mask=torch.from_numpy(masks[0]).long(),
        negative_prompt_embeds=torch.from_numpy(embeds[1]),
        negative_prompt_embeds_mask=torch.from_numpy(masks[1]).long(),
        prompt_embeds_2=glyphs,
        prompt_embeds_mask_2=no_glyphs,
        negative_prompt_embeds_2=glyphs,
        negative_prompt_embeds_mask_2=no_glyphs,
        num_frames=FRAMES,
        height=HEIGHT,
        width=WIDTH,
        num_inference_steps=STEPS,
        latents=_latents(ours["noise"]),
    )
    # This pipeline takes no step callback: the latents come from a second run.
    latents = pipe(**kwargs, output_type="latent").frames
    want = pipe(**kwargs, output_type="np").frames
    assert_close(ours["latents"], latents.permute(0, 2, 3, 4, 1).numpy(), 1e-4, "final latents")
    assert_close(ours["frames"], want[0], 1e-4, "frames")


def test_sharded_transformer_loads_the_same(wan_pipeline, tmp_path):
    """A transformer saved in shards (`*.safetensors.index.json`) gives the same video."""
    import shutil

    pipe, root = wan_pipeline
    sharded = tmp_path / "sharded"
    shutil.copytree(root, sharded, ignore=shutil.ignore_patterns("transformer"))
    pipe.transformer.save_pretrained(
        sharded / "transformer", safe_serialization=True, max_shard_size="20KB"
    )
    assert len(list((sharded / "transformer").glob("*.safetensors"))) > 1
    assert list((sharded / "transformer").glob("*.safetensors.index.json"))
    ours = _run_cli(tmp_path, "--checkpoint", str(root), "--prompt", PROMPT)
    again = _run_cli(tmp_path, "--checkpoint", str(sharded), "--prompt", PROMPT)
    np.testing.assert_array_equal(again["frames"], ours["frames"])
