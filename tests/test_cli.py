"""The `vidax` command line: real runs and one-line errors."""

import pytest
from typer.testing import CliRunner

from vidax.cli import app
from vidax.video import read_video

pytestmark = pytest.mark.filterwarnings("ignore:no (VAE )?weights")
runner = CliRunner()


def test_generate_writes_a_playable_mp4(tmp_path):
    out = tmp_path / "clip.mp4"
    result = runner.invoke(
        app,
        [
            "generate",
            "--prompt",
            "a red circle",
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


def test_subcommands_are_registered():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("generate", "models", "plan", "train", "eval"):
        assert command in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--accel", "warp"], "--accel must be one of"),
        (["--budget", "1.5"], "--budget must be in (0, 1]"),
        (["--plan", "/no/plan.json"], "plan.json"),
        (["--stream"], "--stream needs a causal model"),
        (["--model", "tiny-causal", "--set", "local_topk=999"], "larger than the local window"),
        (["--model", "tiny-causal", "--set", "dim=64"], "--set expects field=value"),
    ],
)
def test_acceleration_plan_and_stream_flags_validate(args, message, tmp_path):
    result = runner.invoke(
        app, ["generate", "--prompt", "x", "--out", str(tmp_path / "o.mp4"), "--steps", "1", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
