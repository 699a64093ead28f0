"""The `vidax` command line: real runs and one-line errors."""

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vidax.checkpoint import open_checkpoint, save_file
from vidax.cli import app
from vidax.models.registry import ASSETS
from vidax.video import read_video

runner = CliRunner()
SMALL = ["--frames", "5", "--height", "32", "--width", "32"]


def _one_error_line(result, message: str) -> None:
    """Exit code 2, and the output is exactly one `error:` line containing `message`."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0]


def test_generate_writes_a_playable_mp4(tmp_path):
    out = tmp_path / "clip.mp4"
    result = runner.invoke(
        app,
        [
            "generate",
            "--prompt",
            "a red circle moving right",
            "--out",
            str(out),
            "--frames",
            "5",
            "--height",
            "32",
            "--width",
            "32",
            "--steps",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    frames = read_video(out)
    assert frames.shape == (5, 32, 32, 3)
    assert "denoising" in result.output and "wrote" in result.output
    # tiny was trained on one caption grammar: it says how it reads a free phrasing.
    assert "prompt read as: 'a red circle bouncing slowly to the right'" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frames", "6"], "num_frames must be"),
        (["--height", "30"], "height and width must be positive multiples of"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--checkpoint", "/does/not/exist"], "checkpoint not found"),
        (["--set", "dim=7"], "not divisible by num_heads"),
        (["--set", "depth=3"], "--set expects field=value"),
    ],
)
def test_bad_input_is_one_line_not_a_traceback(args, message, tmp_path):
    result = runner.invoke(
        app, ["generate", "--prompt", "x", "--out", str(tmp_path / "o.mp4"), "--steps", "1", *args]
    )
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_models_lists_presets_with_sizes():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("tiny", "wan2.1-1.3b", "wan2.1-14b", "hunyuanvideo"):
        assert name in result.output
    assert "1.42B" in result.output


def test_models_lists_causal_presets_and_weights_status_uncut_at_80_columns():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    # A preset's line, then its parts indented below it (wrapped where long).
    rows = [line for line in lines[1:] if not line.startswith(" ")]
    status = {line.split()[0]: line.split("  ")[-1].strip() for line in rows}
    assert "hunyuanvideo1.5-i2v" in status and "siglip-so400m-patch14-384" in result.output
    assert status["tiny"] == status["tiny-causal"] == "shipped"
    for name in ("tiny-v1", "hunyuanvideo-tiny", "hunyuanvideo1.5-tiny", "wan2.1-1.3b"):
        assert status[name] == "needs --checkpoint"


def test_subcommands_are_registered():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("generate", "models", "plan", "train", "eval"):
        assert command in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "1", "--accel", "warp"], "--accel must be one of"),
        (["--steps", "1", "--budget", "1.5"], "--budget must be in (0, 1]"),
        (["--steps", "1", "--plan", "/no/plan.json"], "plan.json"),
        (["--stream"], "--stream needs a causal model"),
        (["--model", "tiny-causal", "--set", "local_topk=999"], "larger than the local window"),
        (["--model", "tiny-causal", "--set", "dim=64"], "--set expects field=value"),
        (["--model", "tiny-causal", "--set", "attention=full"], "'dense' or 'sparse'"),
        # Used to run silently: 20 steps, and a budget nothing read.
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--budget", "0.5"], "--budget 0.5 needs --accel"),
        # The streaming path reports its errors the same way, before any bar is drawn.
        (["--model", "tiny-causal", "--frames", "13"], "--frames 13 gives 4 latent frames"),
    ],
)
def test_acceleration_plan_and_stream_flags_validate(args, message, tmp_path):
    result = runner.invoke(
        app, ["generate", "--prompt", "x", "--out", str(tmp_path / "o.mp4"), *args]
    )
    _one_error_line(result, message)


@pytest.mark.parametrize(
    "sets, attention, overrides",
    [
        ([], "sparse", None),
        (["attention=dense"], "dense", None),
        (["window_frames=6", "attention=dense"], "dense", {"window_frames": 6}),
        (["attention=sparse", "local_topk=1"], "sparse", {"local_topk": 1}),
    ],
)
def test_set_attention_picks_the_causal_variant(sets, attention, overrides, monkeypatch, tmp_path):
    # The variant decides both the cache config the other --set fields edit and the weights.
    import vidax.forcing.command as command

    seen = {}

    def fake_stream_generate(model, prompt, out, **kwargs):
        seen.update(kwargs)
        return command.StreamResult(
            path=Path(out), frames=9, chunks=1, chunk_seconds=(0.1,), latents=np.zeros(1)
        )

    monkeypatch.setattr(command, "stream_generate", fake_stream_generate)
    args = [a for s in sets for a in ("--set", s)]
    result = runner.invoke(
        app,
        [
            "generate",
            "--model",
            "tiny-causal",
            "--prompt",
            "x",
            "--out",
            str(tmp_path / "o.mp4"),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen["attention"] == attention and seen["forcing_overrides"] == overrides


@pytest.mark.parametrize(
    "args, flags",
    [
        (["--accel", "dvg"], "--accel does"),
        (["--budget", "0.5"], "--budget does"),
        (["--steps", "4", "--guidance", "3"], "--steps, --guidance do"),
        (["--shift", "5", "--sampler", "euler"], "--shift, --sampler do"),
        (["--negative-prompt", "blur"], "--negative-prompt does"),
        (["--checkpoint", "w.safetensors", "--plan", "plan.json"], "--checkpoint, --plan do"),
        (["--prompt-embeds", "e.npy"], "--prompt-embeds does"),
        (["--lora", "style.safetensors"], "--lora does"),
    ],
)
def test_flags_a_causal_model_ignores_are_errors(args, flags, tmp_path):
    result = runner.invoke(
        app, ["generate", "--model", "tiny-causal", "--prompt", "x", "--out", "o.mp4", *args]
    )
    _one_error_line(result, f"{flags} not apply to the causal model 'tiny-causal'")


@pytest.mark.parametrize(
    "model, parts",
    [
        ("hunyuanvideo-tiny", "transformer and VAE (hunyuanvideo-tiny)"),
        ("tiny-v1", "transformer and VAE (shapes-v1.5)"),
        ("wan2.1-1.3b", "transformer, VAE (wan2.1) and text encoder (umt5-xxl)"),
    ],
)
def test_missing_weights_are_an_error_naming_the_parts(model, parts, tmp_path):
    # They used to run on random weights (a noise video, exit 0) after one warning.
    out = tmp_path / "o.mp4"
    result = runner.invoke(app, ["generate", "--model", model, "--prompt", "x", "--out", str(out)])
    _one_error_line(result, f"model {model!r} has no weights for its {parts}: pass --checkpoint")
    assert "--random-weights" in result.output and not out.exists()


def test_random_weights_run_with_one_loud_line(tmp_path):
    out = tmp_path / "o.mp4"
    args = ["generate", "--model", "tiny-v1", "--prompt", "x", "--out", str(out), "--steps", "1"]
    result = runner.invoke(app, [*args, *SMALL, "--set", "num_layers=1", "--random-weights"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: RANDOM WEIGHTS (--random-weights): 'tiny-v1' runs its transformer, VAE on "
        "random initialisation; the output is noise"
    ]
    assert read_video(out).shape == (5, 32, 32, 3)


def _shipped_tiny_with(tmp_path, key: str, value: float):
    tensors = dict(open_checkpoint(ASSETS / "tiny" / "transformer.safetensors"))
    tensors[key] = np.full_like(tensors[key], value)
    path = tmp_path / "transformer.safetensors"
    save_file(tensors, path)
    return path


def test_a_nan_weight_is_an_error_naming_file_and_key(tmp_path):
    # It used to load, and the video came out all black with exit code 0.
    path = _shipped_tiny_with(tmp_path, "proj_out.bias", np.nan)
    args = ["generate", "--prompt", "x", "--out", str(tmp_path / "o.mp4"), *SMALL]
    result = runner.invoke(app, [*args, "--checkpoint", str(path)])
    _one_error_line(result, f"{path}: tensor 'proj_out.bias' has 32 non-finite values")


def test_non_finite_latents_stop_with_the_step(tmp_path):
    # Finite weights so large that the first forward overflows.
    path = _shipped_tiny_with(tmp_path, "patch_embedding.weight", 3e38)
    out = tmp_path / "o.mp4"
    args = ["generate", "--prompt", "x", "--out", str(out), *SMALL, "--steps", "2"]
    result = runner.invoke(app, [*args, "--checkpoint", str(path)])
    assert result.exit_code == 2, result.output
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("error: sampling produced non-finite latents (NaN or inf) at ")
    assert "denoising step 1 of 2" in error and not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "vae", "--steps", "0"], "steps must be >= 1"),
        (["train", "dit", "--vae-run", "/nonexistent"], "VAE run not found"),
        (["eval", "--steps", "0"], "--steps must be >= 1, got 0"),
        (["eval", "--model", "tiny-v1"], "ships no weights for its transformer"),
        (["eval", "--model", "tiny-causal", "--weights", "."], "--weights does not apply"),
        (["eval", "--model", "tiny-causal", "--frames", "13"], "--frames 13 gives 4 latent"),
        (["eval", "--model", "tiny-causal", "--steps", "4"], "do not apply to the causal"),
        (["eval", "--model", "tiny-causal", "--guidance", "0.5"], "guidance must be >= 1"),
        (["eval", "--attention", "dense"], "--attention applies to causal models only"),
        (["plan", "--topology", "v5e:2x4", "--size", "480"], "--size must be HEIGHTxWIDTH"),
        (["train", "export", "--vae-run", "/nonexistent"], "not found: train both stages"),
    ],
)
def test_every_subcommand_reports_user_errors_in_one_line(args, message, tmp_path):
    # `train` and `eval` errors used to end in 36-59 line tracebacks.
    if args[:2] == ["train", "vae"]:
        args = [*args, "--run-dir", str(tmp_path)]
    _one_error_line(runner.invoke(app, args), message)


def test_export_writes_to_a_folder_the_user_names_not_the_package(tmp_path, monkeypatch):
    vae_run, dit_run = tmp_path / "vae", tmp_path / "dit"
    vae_run.mkdir()
    dit_run.mkdir()
    (vae_run / "vae.safetensors").write_bytes(b"vae")
    (vae_run / "latent_stats.json").write_text('{"mean": [0.0], "std": [1.0]}')
    (dit_run / "transformer.safetensors").write_bytes(b"dit")
    shipped = (ASSETS / "tiny" / "transformer.safetensors").read_bytes()
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["train", "export", "--vae-run", "vae", "--dit-run", "dit"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "export" / "transformer.safetensors").read_bytes() == b"dit"
    assert (tmp_path / "runs" / "export" / "latent_stats.json").exists()
    assert (ASSETS / "tiny" / "transformer.safetensors").read_bytes() == shipped
    args = ["train", "export", "--vae-run", "vae", "--dit-run", "dit", "--out", "mine"]
    assert runner.invoke(app, args).exit_code == 0
    assert (tmp_path / "mine" / "vae.safetensors").read_bytes() == b"vae"


def test_generate_writes_raw_outputs_and_pngs(tmp_path):
    from vidax import pipeline

    out, pngs = tmp_path / "clip.npz", tmp_path / "frames"
    args = ["generate", "--prompt", "a red circle", "--out", str(out), *SMALL, "--steps", "2"]
    result = runner.invoke(app, [*args, "--seed", "3", "--save-frames", str(pngs)])
    assert result.exit_code == 0, result.output
    raw = np.load(out)
    assert raw["frames"].shape == (5, 32, 32, 3) and raw["frames"].dtype == np.float32
    assert raw["latents"].shape == raw["noise"].shape == (1, 2, 8, 8, 8)
    # The same call from Python starts from the same noise and ends at the same latents.
    video = pipeline.generate(
        "tiny", "a red circle", num_frames=5, height=32, width=32, steps=2, seed=3
    )
    np.testing.assert_array_equal(raw["noise"], video.noise)
    np.testing.assert_allclose(raw["latents"], video.latents, atol=1e-6)
    assert sorted(p.name for p in pngs.iterdir())[:2] == ["frame_0000.png", "frame_0001.png"]
    assert len(list(pngs.iterdir())) == 5


def test_lora_merges_into_the_transformer_at_its_scale(tmp_path):
    from vidax import pipeline
    from vidax.models import get

    dim = get("tiny").config.dim
    rng = np.random.default_rng(0)
    lora = tmp_path / "style.safetensors"
    save_file(
        {
            "transformer.blocks.0.attn1.to_q.lora_A.weight": rng.normal(size=(4, dim)),
            "transformer.blocks.0.attn1.to_q.lora_B.weight": rng.normal(size=(dim, 4)),
        },
        lora,
    )
    args = ["generate", "--prompt", "a red circle", *SMALL, "--steps", "2"]

    def latents(*flags):
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.npz"
        result = runner.invoke(app, [*args, "--out", str(out), *flags])
        assert result.exit_code == 0, result.output
        return np.load(out)["latents"]

    plain, off, on = latents(), latents("--lora", f"{lora}:0"), latents("--lora", str(lora))
    np.testing.assert_array_equal(plain, off)  # scale 0 adds nothing
    assert np.abs(on - plain).max() > 1e-3
    video = pipeline.generate(
        "tiny", "a red circle", num_frames=5, height=32, width=32, steps=2, lora=[lora]
    )
    np.testing.assert_allclose(on, video.latents, atol=1e-6)
    missing = runner.invoke(app, [*args, "--lora", str(tmp_path / "none.safetensors")])
    _one_error_line(missing, "LoRA not found")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--fps", "0"], "--fps must be >= 1"),
        (["--out", "x.gif"], "--out must end in .mp4 or .npz"),
        (["--model", "tiny-causal", "--out", "x.npz"], "--out *.npz"),
    ],
)
def test_bad_output_options_are_one_line_errors(flags, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a wrong run might write stays out of the tree
    result = runner.invoke(app, ["generate", "--prompt", "a red circle", *SMALL, *flags])
    _one_error_line(result, message)


def test_generate_with_accel_says_what_dvg_chose(tmp_path):
    # 9 frames: a 3-frame latent, which a temporal factor of 2 divides.
    args = ["generate", "--prompt", "a red circle", "--out", str(tmp_path / "v.mp4")]
    args += ["--frames", "9", "--height", "32", "--width", "32", "--steps", "4"]
    result = runner.invoke(app, [*args, "--accel", "temporal", "--budget", "0.6"])
    assert result.exit_code == 0, result.output
    line = next(s for s in result.output.splitlines() if s.startswith("accel temporal: "))
    assert "chose temporal t/2 s/1 x" in line and " -> t/1 s/1 x" in line
    assert "of the full sampler's token-steps; denoising" in line


@pytest.mark.parametrize(
    ("budget", "said"),
    [("0.2", " (no probe: the same for any content at this budget), "), ("0.4", " for motion ")],
)
def test_generate_with_dvg_says_whether_it_measured_the_video(tmp_path, budget, said):
    # tiny is temporal-only: at 0.2 one schedule wins for any content, at 0.4 the probe decides
    args = ["generate", "--prompt", "a red circle", "--out", str(tmp_path / "v.mp4")]
    args += ["--frames", "33", "--height", "32", "--width", "32", "--accel", "dvg"]
    result = runner.invoke(app, [*args, "--budget", budget])
    assert result.exit_code == 0, result.output
    line = next(s for s in result.output.splitlines() if s.startswith("accel dvg: "))
    assert said in line and "chose temporal t/8 s/1 x" in line


def test_generate_with_the_step_cache_calibrates_then_skips(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDAX_STEP_CACHE_DIR", str(tmp_path / "calibrations"))
    args = ["generate", "--prompt", "a red circle", *SMALL, "--steps", "10", "--accel", "cache"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "a.mp4")])
    assert first.exit_code == 0, first.output
    assert "step cache skipped 0 of 10 model forwards (calibrated now" in first.output
    second = runner.invoke(app, [*args, "--out", str(tmp_path / "b.mp4")])
    assert second.exit_code == 0, second.output
    assert "step cache skipped 3 of 10 model forwards; denoising" in second.output


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "libtpu" else find_spec(name, *a),
    )
    result = runner.invoke(app, ["plan", "--topology", "v5e:2x2", "--model", "tiny"])
    _one_error_line(result, "needs the `libtpu` package to create compile-only TPU devices")
    assert "pip install 'vidax[tpu]'" in result.output


def test_libtpu_start_up_lines_are_hidden_unless_verbose(tmp_path):
    # With libtpu installed on a host without a TPU, jax's backend start-up prints libtpu's
    # failed-initialisation lines ("E0000 ... INVALID_ARGUMENT ...") to the process's stderr.
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed: nothing to hide")
    plan = ["plan", "--topology", "v5e:2x2", "--model", "tiny", "--out", str(tmp_path / "p.json")]
    plan += ["--cache-dir", str(tmp_path / "cache")]
    quiet = subprocess.run([sys.executable, "-m", "vidax", *plan], capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "INVALID_ARGUMENT" not in quiet.stderr and "TPU_WORKER_HOSTNAMES" not in quiet.stderr
    assert "AoiZora plan" in quiet.stdout  # the command's own output is untouched
    loud = subprocess.run(
        [sys.executable, "-m", "vidax", "--verbose", *plan], capture_output=True, text=True
    )
    assert loud.returncode == 0 and "TPU_WORKER_HOSTNAMES" in loud.stderr


def test_image_to_video_and_two_experts_on_tiny_presets(tmp_path):
    from PIL import Image

    image = tmp_path / "first.png"
    rgb = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(image)
    common = ["--prompt", "a red circle", "--random-weights", "--steps", "3"]
    out = tmp_path / "i2v.mp4"
    result = runner.invoke(
        app,
        [
            "generate",
            "--model",
            "wan2.1-i2v-tiny",
            "--image",
            str(image),
            *common,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert read_video(out).shape == (9, 64, 64, 3)
    result = runner.invoke(
        app,
        [
            "generate",
            "--model",
            "wan2.2-a14b-tiny",
            "--guidance-2",
            "2",
            *common,
            "--out",
            str(tmp_path / "a14b.mp4"),
        ],
    )
    assert result.exit_code == 0, result.output
    # What a preset cannot take is a one-line error.
    for args, message in [
        (["--model", "tiny", "--image", str(image)], "'tiny' is text-to-video: it takes no image"),
        (["--model", "tiny", "--guidance-2", "2"], "'tiny' has one transformer"),
        (["--model", "wan2.1-i2v-tiny", "--image", str(tmp_path / "nope.png")], "image not found"),
    ]:
        result = runner.invoke(app, ["generate", *args, *common, "--out", str(tmp_path / "x.mp4")])
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
