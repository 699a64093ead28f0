"""`vidax train causal`: df continued from causal weights on longer clips; one-line errors."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from typer.testing import CliRunner

from vidax.cli import app
from vidax.forcing import load
from vidax.forcing.train import WEIGHTS_FILE
from vidax.models.registry import get_causal

runner = CliRunner()


def test_df_continues_from_causal_weights_on_the_longest_clips(tmp_path):
    """--df-init starts df from the given causal weights (not the bidirectional base) and
    --df-frames 81 trains 21-latent-frame clips, the longest one block-causal forward covers."""
    preset = get_causal("tiny-causal")
    init = preset.weights_path("dense")
    args = ["train", "causal", "--root", str(tmp_path), "--only", "df", "--df-init", str(init)]
    args += ["--df-frames", "81", "--df-steps", "1", "--df-batch", "1", "--no-resumable"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = load(tmp_path / "df" / WEIGHTS_FILE, preset.spec.config)
    start = load(init, preset.spec.config)
    # One step at warm-up's first rate, exported through an EMA of 0.99: next to the init.
    for x, y in zip(
        jax.tree.leaves(nnx.state(out)), jax.tree.leaves(nnx.state(start)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-3)


def test_df_clips_must_fit_one_block_causal_forward(tmp_path):
    args = ["train", "causal", "--root", str(tmp_path), "--only", "df", "--df-frames", "85"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: diffusion forcing clips of 85 frames are 22 latent frames: must be a multiple of "
        "the chunk (3) and at most horizon + chunk (21, one block-causal forward)"
    ]


def test_df_init_and_transformer_are_exclusive(tmp_path):
    init = str(get_causal("tiny-causal").weights_path("dense"))
    args = ["train", "causal", "--root", str(tmp_path), "--df-init", init, "--transformer", init]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--df-init and --transformer" in result.output.strip().splitlines()[-1]
