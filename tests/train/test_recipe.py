"""`vidax train all`: the on-device recipe's schedule, profiles and a smoke run on CPU."""

import dataclasses
import itertools
import json
import math
import time
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.train.recipe import (
    PROFILES,
    Bucket,
    StageSettings,
    get_profile,
    lr_at,
    reduced_token_grid,
    round_robin,
    train_all,
)


def test_round_robin_spreads_buckets_by_weight():
    buckets = [Bucket(frames=1, height=16, width=16, batch=1, weight=w) for w in (1, 2, 6)]
    order = round_robin(buckets)
    assert Counter(order) == {0: 1, 1: 2, 2: 6}
    # The heavy bucket is spread over the cycle, not run as one block.
    assert "2222" not in "".join(map(str, order))
    assert round_robin(PROFILES["h200"].dit.buckets).count(8) == 6


def test_learning_rate_warms_up_then_decays_to_the_floor():
    s = StageSettings(
        buckets=(Bucket(frames=1, height=16, width=16, batch=1),),
        seconds=1.0,
        max_steps=100,
        lr=1e-3,
        warmup=10,
        min_lr_ratio=0.1,
    )
    assert lr_at(0, 100, s) == pytest.approx(1e-4)
    assert lr_at(9, 100, s) == pytest.approx(1e-3)
    assert lr_at(10, 100, s) == pytest.approx(1e-3)
    assert lr_at(55, 100, s) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(100, 100, s) == pytest.approx(1e-4)
    values = [lr_at(i, 100, s) for i in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(frames=4, height=16, width=16, batch=1), "1 \\+ 4k"),
        (dict(frames=1, height=20, width=16, batch=1), "multiple of 8"),
        (dict(frames=1, height=8, width=16, batch=1), "multiple of 8"),
        (dict(frames=1, height=16, width=16, batch=0), "batch"),
        (dict(frames=1, height=16, width=16, batch=1, reduce=(3, 1)), "reduce must be"),
        (dict(frames=1, height=16, width=16, batch=1, reduce=(1, 8)), "reduce must be"),
    ],
)
def test_bad_buckets_are_one_line_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Bucket(**kwargs)


def test_profiles_and_overrides():
    with pytest.raises(ValueError, match="unknown profile 'nope'; known: h200, smoke"):
        get_profile("nope")
    with pytest.raises(ValueError, match="positive"):
        get_profile("h200", batch_scale=0)
    p = get_profile("h200", dit_seconds=12.0, batch_scale=0.5, seed=3)
    assert p.dit.seconds == 12.0 and p.vae.seconds == PROFILES["h200"].vae.seconds
    assert [b.batch for b in p.dit.buckets] == [
        max(1, round(b.batch / 2)) for b in PROFILES["h200"].dit.buckets
    ]
    assert p.seed == 3
    with pytest.raises(ValueError, match="trained text encoder"):
        dataclasses.replace(PROFILES["smoke"], model="wan2.1-1.3b")
    with pytest.raises(FileNotFoundError, match="VAE weights"):
        dataclasses.replace(PROFILES["smoke"], vae_init="/nonexistent/vae.safetensors")


def test_h200_buckets_cover_the_sizes_dvg_reduces_to():
    shapes = {(b.frames, b.height, b.width) for b in PROFILES["h200"].dit.buckets}
    assert {f for f, _, _ in shapes} == {1, 9, 17, 33, 81}
    assert {h for _, h, _ in shapes} >= {32, 48, 64}
    assert any(h != w for _, h, w in shapes)
    # ... and DVG's own reduced grids: space /2 and time /4, /8 at the default size, time /2
    # and /4 at Wan's 81 frames.
    reduced = [b for b in PROFILES["h200"].dit.buckets if b.reduce != (1, 1)]
    assert [b.name for b in reduced] == [
        "33x64x64/1x2",
        "33x64x64/4x1",
        "33x64x64/8x1",
        "81x64x64/2x1",
        "81x64x64/4x1",
    ]
    grids = {b.name: reduced_token_grid(b, (4, 4), (1, 2, 2)) for b in reduced}
    assert grids["81x64x64/2x1"] == (11, 8, 8) and grids["81x64x64/4x1"] == (6, 8, 8)


def test_dvg_buckets_train_on_dvgs_reduced_grid():
    from vidax.dvg.transition import positions as dvg_positions
    from vidax.models.registry import get
    from vidax.nn import video_positions
    from vidax.train.dit import DiTStageConfig, dit_loss

    # 33x64x64 clips -> latent 9x16x16 -> space /2: 9x8x8 -> tokens 9x4x4 (patch 1x2x2).
    bucket = Bucket(frames=33, height=64, width=64, batch=1, reduce=(1, 2))
    assert reduced_token_grid(bucket, (4, 4), (1, 2, 2)) == (9, 4, 4)
    assert reduced_token_grid(dataclasses.replace(bucket, reduce=(2, 4)), (4, 4), (1, 2, 2)) == (
        5,
        2,
        2,
    )
    # Time /8 keeps latent frames 0 and 8 of 9.
    assert reduced_token_grid(dataclasses.replace(bucket, reduce=(8, 1)), (4, 4), (1, 2, 2)) == (
        2,
        8,
        8,
    )
    odd = Bucket(frames=9, height=16, width=24, batch=1, reduce=(1, 2))  # 3x4x6 -> 3x2x3
    assert reduced_token_grid(odd, (4, 4), (1, 2, 2)) is None
    with pytest.raises(ValueError, match="bucket 9x16x24/1x2: its latent grid reduced by"):
        dataclasses.replace(
            PROFILES["smoke"], dit=dataclasses.replace(PROFILES["smoke"].dit, buckets=(odd,))
        )
    with pytest.raises(ValueError, match="VAE buckets train on whole frames"):
        dataclasses.replace(
            PROFILES["smoke"], vae=dataclasses.replace(PROFILES["smoke"].vae, buckets=(bucket,))
        )

    # The loss reads the batch's RoPE positions: integer ones are the default grid's, DVG's
    # full-resolution coordinates are another input.
    spec = get("tiny")
    model = spec.build(seed=0)
    key = jax.random.key(0)
    latents = jax.random.normal(key, (1, 3, 8, 8, 8))
    batch = {
        "latents": latents,
        "objects": jnp.zeros((*latents.shape[:-1], 1)),
        "context": jax.random.normal(key, (1, 32, spec.config.text_dim)),
    }
    config = DiTStageConfig(model="tiny")
    plain = dit_loss(model, batch, key, config)[0]
    integer = dit_loss(model, {**batch, "positions": video_positions(3, 4, 4)}, key, config)[0]
    scaled = jnp.asarray(dvg_positions((3, 4, 4), (1, 2), (1, 2, 2)))
    dvg = dit_loss(model, {**batch, "positions": scaled}, key, config)[0]
    assert float(integer) == pytest.approx(float(plain), rel=1e-6)
    assert abs(float(dvg) - float(plain)) > 1e-4


def test_smoke_run_writes_a_usable_model(tmp_path):
    from typer.testing import CliRunner

    from vidax import pipeline
    from vidax.cli import app
    from vidax.models.registry import get
    from vidax.models.weights import load_folder

    summary = train_all(tmp_path, PROFILES["smoke"], log=lambda line: None)
    assert summary["vae"]["steps"] == 3 and summary["dit"]["steps"] == 4
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["stage"] == "dit"] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in records)
    stats = json.loads((tmp_path / "latent_stats.json").read_text())
    assert len(stats["mean"]) == 8 and min(stats["std"]) > 0

    # The folder loads as a model (its latent statistics replace the preset's) and samples.
    transformer, vae, text = load_folder(get("tiny"), tmp_path)
    assert vae.config.latents_mean == tuple(stats["mean"])
    video = pipeline.generate(
        get("tiny"),
        "a red circle standing still",
        num_frames=5,
        height=32,
        width=32,
        steps=2,
        transformer=transformer,
        vae=vae,
        text_encoder=text,
    )
    assert video.frames.shape == (5, 32, 32, 3) and np.isfinite(video.frames).all()
    # ... and `vidax eval --weights` scores it.
    args = ["eval", "--model", "tiny", "--weights", str(tmp_path), "--limit", "1"]
    args += ["--seeds", "1", "--frames", "5", "--steps", "2", "--height", "32", "--width", "32"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "eval" / "results.json").exists()


def test_a_deadline_shortens_the_stage_and_missing_vae_runs_are_named(tmp_path):
    from vidax.train.recipe import load_recipe_vae, run_stage

    settings = StageSettings(
        buckets=(Bucket(frames=1, height=16, width=16, batch=2),),
        seconds=1000.0,
        max_steps=10_000,
        lr=1e-3,
        warmup=2,
        calibration_steps=3,
    )

    def fake_step(state, frozen, key, lr):
        time.sleep(0.01)
        return state + 1, {"loss": jnp.float32(1.0)}

    lines, saves = [], []
    state, summary = run_stage(
        "t",
        settings,
        [fake_step],
        0,
        None,
        seed=0,
        log_every=1000,
        checkpoint_seconds=1e9,
        save=lambda state, step: saves.append(step),
        log=lines.append,
        write_log=lambda record: None,
        deadline=time.perf_counter() + 10.5,  # 10 s are kept for the last save: ~0.5 s left
    )
    assert 3 <= summary["steps"] < 200 and state == summary["steps"]
    assert saves == [summary["steps"]] and summary["clips"] == 2 * summary["steps"]
    assert any("before the run's deadline" in line for line in lines)
    with pytest.raises(FileNotFoundError, match="not a finished VAE stage"):
        load_recipe_vae(tmp_path, "shapes")


def test_the_checked_in_vae_stage_loads_with_its_statistics():
    from pathlib import Path

    from vidax.train.recipe import load_recipe_vae

    folder = Path(__file__).parents[2] / "src" / "vidax" / "assets" / "tiny"
    stats = json.loads((folder / "latent_stats.json").read_text())
    vae = load_recipe_vae(folder, "shapes")
    assert vae.config.latents_mean == tuple(stats["mean"])
    assert vae.config.latents_std == tuple(stats["std"])
    # The shipped folder is a finished VAE stage whose statistics are the preset's.
    from vidax.models.wan_vae import PRESETS as VAES

    assert (VAES["shapes"].latents_mean, VAES["shapes"].latents_std) == (
        vae.config.latents_mean,
        vae.config.latents_std,
    )


def test_vae_from_skips_the_vae_stage_and_copies_it(tmp_path, monkeypatch):
    from pathlib import Path

    from vidax.train import recipe

    calls = []

    def fake_dit_stage(profile, vae, out, log, write_log, **kwargs):
        calls.append((vae.config.latents_mean, kwargs))
        return None, None, {"steps": 0}

    monkeypatch.setattr(recipe, "train_dit_stage", fake_dit_stage)
    monkeypatch.setattr(recipe, "train_vae_stage", lambda *a: pytest.fail("VAE stage ran"))
    folder = Path(__file__).parents[2] / "src" / "vidax" / "assets" / "tiny"
    summary = train_all(tmp_path, PROFILES["smoke"], vae_from=folder, log=lambda line: None)
    stats = json.loads((folder / "latent_stats.json").read_text())
    assert calls[0][0] == tuple(stats["mean"]) and "check_only" not in calls[0][1]
    assert summary["vae"] == {"from": str(folder)}
    for name in ("vae.safetensors", "latent_stats.json"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes()


def test_dit_init_continues_an_earlier_runs_weights(tmp_path, monkeypatch):
    import dataclasses
    from pathlib import Path

    from flax import nnx

    from vidax.checkpoint import save_model
    from vidax.models import word_encoder
    from vidax.models.registry import get
    from vidax.models.wan import WanTransformer, key_map
    from vidax.models.word_encoder import WordEncoder
    from vidax.train import recipe

    spec = get("tiny")
    f32 = dict(dtype="float32", param_dtype="float32")
    dit_config = dataclasses.replace(spec.config, **f32)
    text_config = dataclasses.replace(spec.text_config, **f32)
    dit = WanTransformer(dit_config, rngs=nnx.Rngs(3))
    text = WordEncoder(text_config, rngs=nnx.Rngs(4))
    save_model(dit, tmp_path / recipe.TRANSFORMER_FILE, key_map(dit_config), dtype=jnp.bfloat16)
    word_encoder.save(text, tmp_path / recipe.TEXT_ENCODER_FILE, dtype=jnp.bfloat16)

    # The bf16 files come back as float32 master weights equal to the rounded originals.
    loaded_dit, loaded_text = recipe.load_recipe_dit(tmp_path, dit_config, text_config)
    for original, loaded in ((dit, loaded_dit), (text, loaded_text)):
        pairs = zip(
            jax.tree.leaves(nnx.state(original, nnx.Param)),
            jax.tree.leaves(nnx.state(loaded, nnx.Param)),
            strict=True,
        )
        for a, b in pairs:
            assert b.dtype == jnp.float32
            np.testing.assert_array_equal(b, a.astype(jnp.bfloat16).astype(jnp.float32))
    with pytest.raises(FileNotFoundError, match="not a recipe run's DiT stage"):
        recipe.load_recipe_dit(tmp_path / "missing", dit_config, text_config)

    # train_all hands the folder to the DiT stage, and only with the VAE it was trained on.
    seen = []
    monkeypatch.setattr(
        recipe,
        "train_dit_stage",
        lambda *a, **kwargs: seen.append(kwargs["dit_init"]) or (None, None, {"steps": 0}),
    )
    folder = Path(__file__).parents[2] / "src" / "vidax" / "assets" / "tiny"
    out = tmp_path / "out"
    summary = train_all(
        out, PROFILES["smoke"], vae_from=folder, dit_init=tmp_path, log=lambda line: None
    )
    assert seen == [tmp_path] and summary["dit_init"] == str(tmp_path)
    with pytest.raises(ValueError, match="dit_init needs vae_from"):
        train_all(out, PROFILES["smoke"], dit_init=tmp_path, log=lambda line: None)


def test_decoder_only_vae_stage_keeps_the_encoder_and_its_statistics(tmp_path):
    from pathlib import Path

    from safetensors.numpy import load_file

    profile = get_profile("smoke", vae_decoder_only=True)
    summary = train_all(tmp_path, profile, vae_only=True, log=lambda line: None)
    assert summary["vae"]["steps"] == 3 and "dit" not in summary
    assert not (tmp_path / "transformer.safetensors").exists()
    shipped = Path(profile.vae_init)
    before, after = load_file(shipped), load_file(tmp_path / "vae.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    # Every decoder-side tensor may move (the EMA of 3 steps); nothing before the latent does.
    assert changed and all(k.startswith(("decoder.", "post_quant_conv.")) for k in changed)
    assert (tmp_path / "latent_stats.json").read_text() == (
        shipped.parent / "latent_stats.json"
    ).read_text()

    with pytest.raises(ValueError, match="needs vae_init"):
        dataclasses.replace(profile, vae_init=None)
    with pytest.raises(FileNotFoundError, match=r"latent_stats\.json"):
        no_stats = tmp_path / "bare"
        no_stats.mkdir()
        (no_stats / "vae.safetensors").write_bytes(shipped.read_bytes())
        dataclasses.replace(profile, vae_init=str(no_stats / "vae.safetensors"))
    with pytest.raises(ValueError, match="vae_only"):
        train_all(tmp_path, profile, vae_only=True, vae_from=shipped.parent)


def test_bucket_lists_restrict_a_stage_by_name_and_reweight():
    profile = get_profile("h200", vae_buckets=["33x32x32", "33x64x64"], batch_scale=0.5)
    assert [(b.name, b.batch) for b in profile.vae.buckets] == [("33x32x32", 12), ("33x64x64", 4)]
    assert profile.dit == get_profile("h200", batch_scale=0.5).dit
    with pytest.raises(ValueError, match=r"unknown VAE bucket.*3x3x3.*has 1x64x64"):
        get_profile("h200", vae_buckets=["33x64x64", "3x3x3"])
    # DiT buckets by the same names (DVG's with their reduction), weights changed by "*W".
    dit = get_profile("h200", dit_buckets=["33x32x32*3", "33x64x64/1x2"]).dit.buckets
    assert [(b.name, b.weight, b.reduce) for b in dit] == [
        ("33x32x32", 3.0, (1, 1)),
        ("33x64x64/1x2", 2, (1, 2)),
    ]
    with pytest.raises(ValueError, match=r"bad DiT bucket weight in '33x32x32\*x'"):
        get_profile("h200", dit_buckets=["33x32x32*x"])
    with pytest.raises(ValueError, match=r"unknown DiT bucket.*\(none given\)"):
        get_profile("h200", dit_buckets=[])
