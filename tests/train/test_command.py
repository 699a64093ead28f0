"""`vidax train` / `vidax eval` through a typer app, and resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from vidax.eval.command import register as register_eval
from vidax.train.command import register

_ENTRY = "import typer; from vidax.train.command import register; app = typer.Typer(); register(app); app()"


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()
    register(app)
    register_eval(app)
    return app


def test_commands_are_registered(app):
    runner = CliRunner()
    out = runner.invoke(app, ["train", "--help"])
    assert out.exit_code == 0
    for name in ("vae", "dit", "export"):
        assert name in out.output
    assert runner.invoke(app, ["eval", "--help"]).exit_code == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "vae", "--frames", "8"], "frames"),
        (["train", "vae", "--vae", "nope"], "unknown VAE preset"),
        (["train", "vae", "--data-parallel", "0"], "--data-parallel"),
        (["train", "vae", "--data-parallel", "1024"], "devices"),
        (["train", "dit", "--vae-run", "/nonexistent"], "not found"),
        (["eval", "--limit", "0"], "--limit"),
        (["eval", "--weights", "/nonexistent"], "not found"),
        (["eval", "--random", "-1"], "--random"),
        (["eval", "--random", "2", "--seed", "-1"], "--seed"),
        (["eval", "--no-fixed"], "nothing to score"),
        (["eval", "--height", "8"], "--height must be >= 16"),
        (["eval", "--width", "36"], "multiples of 8"),
    ],
)
def test_bad_input_raises_a_clear_error(app, tmp_path, args, message):
    out = CliRunner().invoke(
        app,
        [*args]
        + (["--run-dir", str(tmp_path)] if args[0] == "train" and args[1] != "export" else []),
    )
    assert out.exit_code != 0
    assert isinstance(out.exception, (ValueError, FileNotFoundError))
    assert message in str(out.exception)


def test_eval_scores_weights_from_a_folder(app, tmp_path):
    import shutil

    from vidax.models.registry import ASSETS

    weights = tmp_path / "weights"
    shutil.copytree(ASSETS / "tiny", weights)
    args = ["eval", "--weights", str(weights), "--limit", "1", "--seeds", "1", "--frames", "5"]
    args += ["--steps", "2", "--no-references", "--out", str(tmp_path / "eval")]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert len(results["samples"]) == 1
    assert "| caption_adherence |" in out.output


def test_eval_random_prompts_at_a_non_default_size(app, tmp_path):
    args = ["eval", "--random", "2", "--seed", "18", "--no-fixed", "--height", "48"]
    args += ["--width", "64", "--frames", "5", "--steps", "2", "--seeds", "1"]
    out = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "## random 2 from seed 18: 2 prompts x 1 seed, 48x64, 5 frames" in out.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["label"] == "random 2 from seed 18"
    assert (results["settings"]["height"], results["settings"]["width"]) == (48, 64)
    # random_eval_prompts(2, 18): a single object under a pan, then a fast one.
    assert [s["category"] for s in results["samples"]] == ["pan", "fast"]
    for name in ("generated", "ground truth", "vae"):
        assert set(results["by_category"][name]["caption_adherence"]) == {"pan", "fast"}
    assert [s["caption_adherence"] for s in results["references"]["ground truth"]] == [1.0, 1.0]
    assert "| pan | 1 |" in out.output and "| ground truth (n=2) |" in out.output


def _log(run_dir):
    path = run_dir / "log.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _checkpoints(run_dir):
    root = run_dir / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.exists() else []


def test_resume_after_sigkill_continues_the_loss_curve(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "train",
        "vae",
        "--run-dir",
        str(run_dir),
        "--vae",
        "tiny",
        "--frames",
        "5",
        "--short-frames",
        "5",
        "--crop",
        "16",
        "--batch-size",
        "1",
        "--checkpoint-every",
        "2",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    proc = subprocess.Popen(
        [sys.executable, "-c", _ENTRY, *args, "--steps", "1000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            ckpts = _checkpoints(run_dir)
            if ckpts and len(_log(run_dir)) > ckpts[-1]:
                break  # a checkpoint exists and at least one step was logged after it
            time.sleep(0.2)
        else:
            pytest.fail("training made no checkpoint in time")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    before = _log(run_dir)
    saved = _checkpoints(run_dir)[-1]
    assert len(before) > saved
    target = len(before) + 1
    out = subprocess.run(
        [sys.executable, "-c", _ENTRY, *args, "--steps", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    after = _log(run_dir)
    assert [r["step"] for r in after] == list(range(1, target + 1))  # no gap, no duplicate
    assert after[:saved] == before[:saved]  # the checkpointed part of the curve is kept
    # Steps redone after the resume see the same data and keys: identical losses.
    for old, new in zip(before[saved:], after[saved : len(before)], strict=True):
        assert new["loss"] == old["loss"], (old, new)
    assert _checkpoints(run_dir)[-1] == target
    meta = json.loads((run_dir / "checkpoints" / str(target) / "meta" / "metadata").read_text())
    assert meta["data"] == {"seed": 0, "step": target}  # the loader resumed, no batch lost
