"""The evaluation harness: prompt x seed pairs, scoring, table, contact sheet, report files."""

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx

from vidax.data import EVAL_PROMPTS, render
from vidax.eval.harness import (
    Report,
    _score,
    contact_sheet,
    evaluate_prompts,
    format_table,
    prompt_seeds,
    video_grid,
    write_report,
)


def _truth(prompt, frames=9):
    video, _ = render(prompt.spec, frames)
    return (video + 1.0) / 2.0


def _report(prompts, seeds=2, blank_second=True):
    samples = []
    for p in prompts:
        for k, seed in enumerate(s for q, s in prompt_seeds([p], seeds)):
            frames = _truth(p)
            if blank_second and k == 1:
                frames = np.full_like(frames, 0.2)  # an empty video: nothing adheres
            samples.append(_score(p, seed, frames))
    refs = {"ground truth": [_score(p, p.seed, _truth(p)) for p in prompts]}
    return Report("tiny", samples, refs, {"steps": 1}, 0.0)


def test_prompt_seeds_are_distinct_replicates():
    pairs = prompt_seeds(EVAL_PROMPTS[:3], 2)
    assert len(pairs) == 6 and len({s for _, s in pairs}) == 6
    assert [p.name for p, _ in pairs] == [p.name for p in EVAL_PROMPTS[:3] for _ in range(2)]
    with pytest.raises(ValueError):
        prompt_seeds(EVAL_PROMPTS[:3], 0)
    with pytest.raises(ValueError):
        prompt_seeds([], 1)


def test_summary_and_table_reflect_the_samples():
    report = _report(EVAL_PROMPTS[:4])
    summary = report.summary()
    assert summary["caption_adherence"].n == 8
    np.testing.assert_allclose(summary["caption_adherence"].mean, 0.5)  # truth 1, blank 0
    table = format_table(report)
    assert "| caption_adherence | 0.500 ± 0.500 | 1.000 ± 0.000 |" in table
    assert "| static |" in table
    by = report.by_category()
    assert set(by) == {p.category for p in EVAL_PROMPTS[:4]}
    # shape confusion: truth reads every object right, the blank seed misses every object
    asked = [o.shape for p in EVAL_PROMPTS[:4] for o in p.spec.objects]
    confusion = report.shape_confusion()
    for shape, row in confusion.items():
        n = asked.count(shape)
        assert row == {**dict.fromkeys(row, 0), shape: n, "missing": n}
    assert "| asked shape, read as: | circle | square | triangle | missing |" in table


def test_contact_sheet_layout():
    report = _report(EVAL_PROMPTS[:3])
    sheet = contact_sheet(report, frames=4, scale=2)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3 and sheet.shape[2] == 3
    # 3 rows of (128 px frames + caption line); 3 videos (truth + 2 seeds) of 4 frames each.
    assert sheet.shape[0] >= 3 * 128 and sheet.shape[1] >= 3 * 4 * 128
    red = np.all(sheet == [255, 38, 38], axis=-1)  # the first prompt's red circle, exact colour
    assert red.any()
    with pytest.raises(ValueError):
        contact_sheet(report, frames=0)


def test_video_grid_places_each_video_in_its_row_and_column():
    # Videos of one flat colour each: the grid shows each colour at its row and column.
    colours = [[(1.0, 0.0, 0.0), (0.0, 1.0, 0.0)], [(0.0, 0.0, 1.0), (1.0, 1.0, 0.0)]]
    rows = [
        (
            f"row {r}",
            [
                ("" if c else "label", np.broadcast_to(np.asarray(col), (5, 8, 8, 3)))
                for c, col in enumerate(cols)
            ],
        )
        for r, cols in enumerate(colours)
    ]
    grid = video_grid(rows, frames=3, scale=2)
    gap, text_h, tile = 4, 14, 16
    strip = 3 * tile + gap
    assert grid.shape == (gap + 2 * (tile + text_h + gap), gap + 2 * strip, 3)
    for r, cols in enumerate(colours):
        for c, col in enumerate(cols):
            # the bottom-right pixel of the last frame's tile (no label text drawn there)
            y = gap + r * (tile + text_h + gap) + text_h + tile - 1
            x = gap + c * strip + 3 * tile - 1
            assert tuple(grid[y, x]) == tuple(int(v * 255) for v in col)
    with pytest.raises(ValueError, match="one"):
        video_grid([("a", [("x", np.zeros((5, 8, 8, 3))), ("y", np.zeros((5, 8, 9, 3)))])])
    with pytest.raises(ValueError, match="at least one video"):
        video_grid([("a", [])])


def test_write_report_files(tmp_path):
    report = _report(EVAL_PROMPTS[:2])
    paths = write_report(report, tmp_path)
    assert paths["table"].read_text().startswith("| metric |")
    record = json.loads(paths["results"].read_text())
    assert len(record["samples"]) == 4 and record["model"] == "tiny"
    import imageio.v3 as iio

    assert iio.imread(paths["contact_sheet"]).shape == contact_sheet(report).shape


def test_evaluate_prompts_runs_the_pipeline():
    from vidax.models import wan_vae
    from vidax.models.registry import get
    from vidax.models.wan import WanTransformer

    spec = get("tiny")
    small = dataclasses.replace(spec.config, dim=32, num_heads=2, ffn_dim=64, num_layers=1)
    transformer = WanTransformer(small, rngs=nnx.Rngs(0))
    vae = wan_vae.WanVAE(wan_vae.PRESETS[spec.vae], rngs=nnx.Rngs(0))
    seen = []
    report = evaluate_prompts(
        "tiny",
        prompts=EVAL_PROMPTS[:1],
        seeds=2,
        transformer=transformer,
        vae=vae,
        references=True,
        on_sample=lambda i, n: seen.append((i, n)),
        steps=2,
        num_frames=5,
    )
    assert seen == [(1, 2), (2, 2)]
    assert [s.seed for s in report.samples] == [EVAL_PROMPTS[0].seed, EVAL_PROMPTS[0].seed + 100000]
    assert report.samples[0].frames.shape == (5, 64, 64, 3)
    assert not np.array_equal(report.samples[0].frames, report.samples[1].frames)
    assert report.settings["steps"] == 2 and report.settings["num_frames"] == 5
    # Rendered ground truth adheres perfectly; a random model's noise does not.
    assert report.references["ground truth"][0].metrics["caption_adherence"] == 1.0
    assert report.summary()["caption_adherence"].mean < 1.0


def test_two_labelled_sets_are_reported_side_by_side(tmp_path):
    from vidax.data import random_eval_prompts

    fixed = dataclasses.replace(_report(EVAL_PROMPTS[:2]), label="fixed")
    fresh = dataclasses.replace(_report(random_eval_prompts(2, 18), seeds=1), label="random 2")
    table = format_table([fixed, fresh])
    assert table.startswith("## fixed: 2 prompts x 2 seeds\n")
    assert "\n## random 2: 2 prompts x 1 seed\n" in table
    assert "| pan | 1 | 1.000 ± 0.000 | 1.000 ± 0.000 | 1.000 ± 0.000 |" in table
    paths = write_report([fixed, fresh], tmp_path)
    assert paths["table"].read_text() == table + "\n"
    sets = json.loads(paths["results"].read_text())["sets"]
    assert [s["label"] for s in sets] == ["fixed", "random 2"]
    assert [s["category"] for s in sets[1]["samples"]] == ["pan", "fast"]
    truth = sets[1]["by_category"]["ground truth"]["caption_adherence"]
    assert {k: v["mean"] for k, v in truth.items()} == {"pan": 1.0, "fast": 1.0}
    import imageio.v3 as iio

    sheets = [contact_sheet(r) for r in (fixed, fresh)]
    height = sum(s.shape[0] for s in sheets)
    assert iio.imread(paths["contact_sheet"]).shape == (height, sheets[0].shape[1], 3)
    with pytest.raises(ValueError, match="distinct labels"):
        format_table([fixed, dataclasses.replace(fresh, label="fixed")])


@pytest.mark.parametrize("height, width", [(30, 64), (8, 8)])
def test_evaluate_prompts_rejects_bad_sizes_before_loading(height, width):
    with pytest.raises(ValueError, match="height and width must be"):
        evaluate_prompts("tiny", prompts=EVAL_PROMPTS[:1], height=height, width=width)


def test_evaluate_prompts_rolls_a_causal_model_out_and_scores_its_last_quarter():
    from vidax.forcing import CausalWan
    from vidax.forcing.rollout import generate_latents
    from vidax.models import wan_vae
    from vidax.models.registry import get_causal
    from vidax.text import embed_prompts

    preset = get_causal("tiny-causal")
    spec = preset.spec
    small = dataclasses.replace(spec.config, dim=32, num_heads=2, ffn_dim=64, num_layers=1)
    causal = CausalWan(small, rngs=nnx.Rngs(0))
    vae = wan_vae.WanVAE(wan_vae.PRESETS[spec.vae], rngs=nnx.Rngs(0))
    prompt = EVAL_PROMPTS[7]
    report = evaluate_prompts(
        "tiny-causal",
        prompts=[prompt],
        seeds=1,
        transformer=causal,
        vae=vae,
        references=True,
        num_frames=21,  # two chunks of 3 latent frames
        attention="dense",
        guidance=2.0,
    )
    assert report.settings == {
        "num_frames": 21, "height": 64, "width": 64, "attention": "dense", "chunks": 2,
        "guidance": 2.0,
    }  # fmt: skip
    sample = report.samples[0]
    assert sample.frames.shape == (21, 64, 64, 3)
    # The video is the rollout of `vidax generate --stream` for that prompt and seed.
    import jax

    text = embed_prompts(spec, [prompt.caption])
    context = text.embeds * text.mask[..., None].astype(text.embeds.dtype)
    latents = generate_latents(
        causal,
        jax.random.key(prompt.seed),
        context,
        causal.layout(dataclasses.replace(preset.dense, guidance=2.0), (16, 16)),
        2,
        latent_hw=(16, 16),
        channels=8,
    )
    expected = np.clip((np.asarray(vae.decode(latents))[0] + 1) / 2, 0, 1)
    np.testing.assert_allclose(sample.frames, expected, atol=1e-5)
    truth = report.references["ground truth"][0].metrics
    assert truth["last_quarter_subject_consistency"] > 0.9
    assert "last_quarter_caption_adherence" in sample.metrics
    assert "| last_quarter_subject_consistency |" in format_table(report)
    with pytest.raises(ValueError, match="do not apply to the causal model"):
        evaluate_prompts("tiny-causal", prompts=[prompt], steps=4)
    with pytest.raises(ValueError, match="guidance must be >= 1"):
        evaluate_prompts("tiny-causal", prompts=[prompt], guidance=0.5, num_frames=21)
    with pytest.raises(ValueError, match="--frames 13 gives 4 latent frames"):
        evaluate_prompts("tiny-causal", prompts=[prompt], num_frames=13)
