"""The shared text -> latents -> frames pipeline, end to end on tiny random checkpoints."""

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax import pipeline, sampling
from vidax.checkpoint import CheckpointError, open_checkpoint, save_file, save_model
from vidax.models import get, get_vae, wan, wan_vae
from vidax.models.weights import (
    RandomWeightsWarning,
    load_text_encoder,
    load_transformer,
    load_vae,
    missing_weights,
)
from vidax.text import embed_prompts, load_prompt_embeds

SMALL = dict(num_frames=5, height=32, width=32, steps=2)


@pytest.fixture(scope="module")
def tiny():
    spec = get("tiny")
    return spec, spec.build(seed=3), get_vae(spec.vae).build(seed=4)


@pytest.fixture(scope="module")
def checkpoint_dir(tiny, tmp_path_factory):
    """A diffusers-layout pipeline folder: transformer/ and vae/."""
    spec, model, vae = tiny
    root = tmp_path_factory.mktemp("pipe")
    (root / "transformer").mkdir()
    (root / "vae").mkdir()
    save_model(
        model,
        root / "transformer" / "diffusion_pytorch_model.safetensors",
        wan.key_map(spec.config),
    )
    wan_vae.save(vae, root / "vae" / "diffusion_pytorch_model.safetensors")
    return root


def test_generate_from_a_checkpoint_folder(tiny, checkpoint_dir):
    spec, model, vae = tiny
    video = pipeline.generate("tiny", prompt="a red circle", checkpoint=checkpoint_dir, **SMALL)
    assert video.frames.shape == (5, 32, 32, 3) and video.frames.dtype == np.float32
    assert video.frames.min() >= 0.0 and video.frames.max() <= 1.0
    assert video.latents.shape == (1, *spec.geometry().latent_shape(5, 32, 32))
    same = pipeline.generate("tiny", prompt="a red circle", transformer=model, vae=vae, **SMALL)
    np.testing.assert_allclose(video.latents, same.latents, atol=1e-5)


def test_seed_prompt_and_guidance_change_the_output(tiny):
    _, model, _ = tiny
    run = lambda **kw: (
        pipeline.generate(
            "tiny",
            transformer=model,
            decode_frames=False,
            **{"prompt": "a red circle", **SMALL, **kw},
        ).latents
    )
    base = run()
    np.testing.assert_array_equal(base, run())  # deterministic
    assert np.abs(base - run(seed=1)).max() > 0.1
    assert np.abs(base - run(prompt="a blue square")).max() > 1e-3
    assert np.abs(base - run(guidance=1.0)).max() > 1e-3
    batch = run(prompt=["a red circle", "a blue square"])
    assert batch.shape[0] == 2


def test_precomputed_embeddings_equal_the_prompt_path(tiny, tmp_path):
    spec, model, _ = tiny
    text = embed_prompts(spec, ["a red circle"])
    path = tmp_path / "embeds.safetensors"
    save_file(
        {"prompt_embeds": np.asarray(text.embeds), "prompt_mask": np.asarray(text.mask)}, path
    )
    embeds, negative = load_prompt_embeds(path, spec)
    assert negative is None
    a = pipeline.generate(
        "tiny", prompt="a red circle", transformer=model, decode_frames=False, **SMALL
    )
    b = pipeline.generate(
        "tiny", prompt_embeds=embeds, transformer=model, decode_frames=False, **SMALL
    )
    np.testing.assert_allclose(a.latents, b.latents, atol=1e-5)
    np.save(tmp_path / "e.npy", np.asarray(text.embeds[0]))
    npy, _ = load_prompt_embeds(tmp_path / "e.npy", spec)
    np.testing.assert_array_equal(npy.mask, text.mask)  # zero rows count as padding


def test_umt5_text_encoder_from_the_checkpoint_folder(tiny, checkpoint_dir, tmp_path):
    from tests.text._tokenizers import word_tokenizer_json
    from vidax.models import umt5

    spec, _, vae = tiny
    enc_cfg = umt5.PRESETS["tiny"]
    spec = dataclasses.replace(
        get("wan2.1-1.3b"),
        config=dataclasses.replace(spec.config, text_dim=enc_cfg.d_model, text_len=16),
        vae=spec.vae,
    )
    root = tmp_path / "wan"
    for sub in ("transformer", "vae", "text_encoder", "tokenizer"):
        (root / sub).mkdir(parents=True)
    model = spec.build(seed=5)
    save_model(model, root / "transformer" / "m.safetensors", wan.key_map(spec.config))
    wan_vae.save(vae, root / "vae" / "m.safetensors")
    encoder = umt5.UMT5Encoder(
        dataclasses.replace(enc_cfg, dtype="float32", param_dtype="float32"), rngs=nnx.Rngs(0)
    )
    save_model(encoder, root / "text_encoder" / "model.safetensors", umt5.key_map(encoder.config))
    hf = {
        k: getattr(enc_cfg, k)
        for k in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
    }
    (root / "text_encoder" / "config.json").write_text(json.dumps(hf))
    word_tokenizer_json(root / "tokenizer" / "tokenizer.json")

    video = pipeline.generate(spec, prompt="a red cube", checkpoint=root, **SMALL)
    assert video.frames.shape == (5, 32, 32, 3)
    text = embed_prompts(spec, ["a red cube"], root)
    assert text.mask.sum() == 4  # "a red cube" + EOS
    other = pipeline.generate(
        spec, prompt="a blue sphere", checkpoint=root, decode_frames=False, **SMALL
    )
    assert np.abs(other.latents - video.latents).max() > 1e-4


@pytest.mark.parametrize("name", ["hunyuanvideo-tiny", "hunyuanvideo1.5-tiny"])
def test_hunyuan_families_share_the_loop(name):
    spec = get(name)
    with pytest.warns(RandomWeightsWarning, match="runs its transformer on random"):
        video = pipeline.generate(
            name, prompt="a red circle", decode_frames=False, random_weights=True, **SMALL
        )
    assert video.latents.shape == (1, *spec.geometry().latent_shape(5, 32, 32))
    assert np.isfinite(video.latents).all()


def test_sharded_generation_equals_single_device(tiny):
    _, model, _ = tiny
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    kw = dict(
        prompt=["a red circle", "a blue square"], transformer=model, decode_frames=False, **SMALL
    )
    want = pipeline.generate("tiny", **kw).latents
    got = pipeline.generate("tiny", mesh=mesh, strategy="fsdp_sp", **kw).latents
    # Sharded sums add in another order: ~1e-5 apart after 8 layers of width 256 (f32).
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=2e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_frames=6), "num_frames must be 4k\\+1"),
        (dict(height=30), "height and width must be positive multiples of"),
        (dict(steps=0), "steps must be"),
        (dict(prompt=None), "exactly one of prompt"),
        (dict(prompt=None, prompt_embeds=np.zeros((1, 4, 7))), "must be \\(b, s, 256\\)"),
        (dict(sampler="ddim"), "unknown"),
    ],
)
def test_bad_requests_raise_clear_errors(tiny, kwargs, message):
    _, model, _ = tiny
    args = {"prompt": "x", **SMALL, **kwargs}
    with pytest.raises(ValueError, match=message):
        pipeline.generate("tiny", transformer=model, decode_frames=False, **args)


def test_unknown_model_and_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"unknown model 'wan3'.*tiny"):
        pipeline.generate("wan3", prompt="x")
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        pipeline.generate("tiny", prompt="x", checkpoint=tmp_path / "nope", **SMALL)
    with pytest.raises(CheckpointError, match=r"transformer, VAE \(wan2.1\) and text encoder"):
        pipeline.generate("wan2.1-1.3b", prompt="x", num_frames=5, height=32, width=32, steps=1)
    # Random weights cannot stand in for umT5: still an error, naming only the text encoder.
    with pytest.raises(CheckpointError, match=r"its text encoder \(umt5-xxl\): pass --check"):
        pipeline.generate("wan2.1-1.3b", prompt="x", random_weights=True)


def test_missing_weights_are_an_error_unless_random_weights_are_asked_for():
    # `tiny` without its shipped weights: no transformer, VAE or text encoder.
    spec = dataclasses.replace(get("tiny"), weights=None).with_config(num_layers=1)
    with pytest.raises(CheckpointError, match="transformer, VAE \\(shapes\\) and text encoder"):
        pipeline.generate(spec, prompt="x", **SMALL)
    loaders = {
        "transformer": lambda **kw: load_transformer(spec, None, **kw),
        "VAE": lambda **kw: load_vae(spec, None, **kw),
        "text encoder": lambda **kw: load_text_encoder(spec, **kw),
    }
    for part, load in loaders.items():
        with pytest.raises(CheckpointError, match=f"'tiny' has no weights for its {part}"):
            load()
        with pytest.warns(RandomWeightsWarning, match=f"runs its {part} on random"):
            assert load(random_weights=True) is not None
    # Given parts are not missing: only the VAE is, and decode_frames=False needs none.
    assert missing_weights(spec, transformer=False, text_encoder=False) == ["VAE"]
    model = spec.build(seed=0)
    with pytest.raises(CheckpointError, match="no weights for its text encoder \\(WordEncoder"):
        pipeline.generate(spec, prompt="x", transformer=model, decode_frames=False, **SMALL)


def test_a_nan_in_a_checkpoint_is_an_error_naming_file_and_key(tiny, checkpoint_dir, tmp_path):
    source = checkpoint_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = dict(open_checkpoint(source))
    key = "blocks.0.attn1.to_q.weight"
    tensors[key] = tensors[key].copy()
    tensors[key][3, 5] = np.nan
    save_file(tensors, tmp_path / "nan.safetensors")
    with pytest.raises(CheckpointError, match=f"nan.safetensors: tensor '{key}' has 1 non-finite"):
        pipeline.generate("tiny", prompt="x", checkpoint=tmp_path / "nan.safetensors", **SMALL)


class _BlowsUp(nnx.Module):
    """A "DiT" whose velocity is finite above timestep 600 and NaN below it."""

    def __call__(self, x, timestep, **cond):
        del cond
        t = timestep.reshape(-1, *([1] * (x.ndim - 1)))
        return jnp.where(t > 600, 0.1 * x, jnp.nan)


def test_non_finite_latents_name_the_first_step_that_made_them():
    solver = sampling.make_solver("euler", 4, 1.0)  # timesteps 1000, 750, 500, 250
    noise = jax.random.normal(jax.random.key(0), (1, 2, 4, 4, 4))
    with pytest.raises(
        ValueError, match="non-finite latents \\(NaN or inf\\) at denoising step 3 of 4"
    ):
        pipeline.denoise(_BlowsUp(), noise, {}, None, solver=solver, guidance=1.0)


@pytest.mark.parametrize("model", ["tiny", "hunyuanvideo-tiny", "hunyuanvideo1.5-tiny"])
def test_a_fresh_progress_callback_compiles_nothing_new(model):
    # Compiled samplers are cached on static values; a new `on_step` (a progress bar, a lambda)
    # or a per-call input function used to be part of the key, so every CLI-style call compiled
    # the whole loop again.
    from vidax.pipeline import _compiled_loop, _compiled_step

    kw = dict(num_frames=5, height=32, width=32, steps=3, decode_frames=False)
    kw |= dict(random_weights=True) if model != "tiny" else {}
    first, second = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomWeightsWarning)
        pipeline.generate(model, "a red circle", on_step=first.append, **kw)
        misses = _compiled_step.cache_info().misses
        video = pipeline.generate(model, "a red circle", on_step=second.append, **kw)
        assert _compiled_step.cache_info().misses == misses
        assert first == second == [0, 1, 2]
        quiet = pipeline.generate(model, "a red circle", **kw)
        loops = _compiled_loop.cache_info().misses
        pipeline.generate(model, "a red circle", **kw)
        assert _compiled_loop.cache_info().misses == loops
    # With progress the loop runs from the host one compiled step at a time; without, as one
    # program: the same latents bit for bit.
    np.testing.assert_array_equal(video.latents, quiet.latents)


@pytest.mark.parametrize("accel", ["none", "temporal"])
def test_progress_puts_no_host_callback_in_the_programs(accel, monkeypatch):
    # jax's persistent compilation cache never keeps a program with a host callback, so with
    # one inside the loop every `vidax generate` (a new process, a progress bar) compiled the
    # sampler again. With progress the programs carry none: tracing a callback here fails.
    def no_callback(*args, **kwargs):
        raise AssertionError("a host callback was traced into a sampling program")

    monkeypatch.setattr(jax.debug, "callback", no_callback)
    kw = dict(num_frames=9, height=64, width=64, steps=7, decode_frames=False, accel=accel)
    kw |= dict(budget=0.75) if accel != "none" else {}
    steps: list[int] = []
    pipeline.generate("tiny", "a blue square moving left", on_step=steps.append, **kw)
    assert steps == list(range(7))


def test_dvg_progress_matches_the_fused_sampler():
    # DVG with progress: each stage's steps, its last step and the transition run from the
    # host; the same sample as the one-program sampler (to float rounding of the transition's
    # fusion) and every base step reported once, in order.
    kw = dict(num_frames=9, height=64, width=64, steps=6, decode_frames=False)
    kw |= dict(accel="temporal", budget=0.75)
    steps: list[int] = []
    stepped = pipeline.generate("tiny", "a red circle", on_step=steps.append, **kw)
    fused = pipeline.generate("tiny", "a red circle", **kw)
    assert len(stepped.choices[0].schedule.stages) == 2
    assert steps == list(range(6))
    np.testing.assert_allclose(stepped.latents, fused.latents, atol=1e-4)


def test_a_second_dvg_generate_compiles_nothing_new():
    # DVG's stage programs are cached on the same static values (HunyuanVideo-1.5: with its
    # zero condition channels).
    from vidax.dvg import sampler

    kw = dict(num_frames=9, height=64, width=64, steps=4, decode_frames=False)
    kw |= dict(random_weights=True, accel="temporal", budget=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = pipeline.generate("hunyuanvideo1.5-tiny", "a red circle", on_step=print, **kw)
        misses = sampler._StagePrograms.of.cache_info().misses
        programs = sampler._StagePrograms.of.cache_info().currsize
        second = pipeline.generate("hunyuanvideo1.5-tiny", "a red circle", on_step=print, **kw)
        assert sampler._StagePrograms.of.cache_info().misses == misses
        assert sampler._StagePrograms.of.cache_info().currsize == programs
        pipeline.generate("hunyuanvideo1.5-tiny", "a red circle", **kw)
        compiled = sampler._compiled.cache_info().misses
        pipeline.generate("hunyuanvideo1.5-tiny", "a red circle", **kw)
        assert sampler._compiled.cache_info().misses == compiled
    np.testing.assert_array_equal(first.latents, second.latents)


def test_adapters_are_equal_across_calls():
    # Equal adapters compare equal: nothing per call goes into the compiled programs' keys.
    for name in ("tiny", "hunyuanvideo-tiny", "hunyuanvideo1.5-tiny"):
        spec = get(name)
        assert pipeline.Adapter.of(spec) == pipeline.Adapter.of(spec)
