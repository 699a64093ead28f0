"""`generate(accel="cache" | "dvg+cache")`: a first run calibrates (and is the full sampler),
later runs skip forwards; sharded runs agree; DVG composes with the cache."""

import jax
import numpy as np
import pytest

from vidax import pipeline

KW = dict(num_frames=9, height=32, width=32, steps=20, decode_frames=False)
KW33 = {**KW, "num_frames": 33}


@pytest.fixture(autouse=True)
def calibrations(tmp_path, monkeypatch):
    monkeypatch.setenv(pipeline.ENV_STEP_CACHE, str(tmp_path / "step_cache"))
    return tmp_path / "step_cache"


def test_the_first_run_calibrates_and_later_runs_skip(calibrations):
    full = pipeline.generate("tiny", "a red circle bouncing", **KW)
    first = pipeline.generate("tiny", "a red circle bouncing", accel="cache", **KW)
    assert first.step_cache.calibrating and first.step_cache.skipped == 0
    np.testing.assert_array_equal(first.latents, full.latents)  # the calibration run is full
    assert first.step_cache.calibration.parent == calibrations
    assert first.step_cache.calibration.is_file()

    cached = pipeline.generate("tiny", "a red circle bouncing", accel="cache", **KW)
    assert not cached.step_cache.calibrating
    assert 0 < cached.step_cache.skipped <= 8  # keeps 0.6 of 20 forwards at least

    def err(latents):
        return np.abs(latents - full.latents).mean() / np.abs(full.latents).mean()

    # The cache's claim (docs/dvg.md §7): at equal forwards it stays closer to the full sampler
    # than running fewer steps does.
    forwards = KW["steps"] - cached.step_cache.skipped
    fewer_steps = pipeline.generate("tiny", "a red circle bouncing", **{**KW, "steps": forwards})
    assert 0 < err(cached.latents) < min(0.15, err(fewer_steps.latents))
    fewer = pipeline.generate("tiny", "a red circle bouncing", accel="cache", budget=0.9, **KW)
    assert 0 < fewer.step_cache.skipped == 2


def test_a_calibration_is_per_model_size_and_schedule():
    a = pipeline.generate("tiny", "a red circle", accel="cache", **KW).step_cache
    b = pipeline.generate("tiny", "a red circle", accel="cache", **{**KW, "steps": 16})
    c = pipeline.generate("tiny", "a red circle", accel="cache", **{**KW, "height": 48})
    assert len({a.calibration, b.step_cache.calibration, c.step_cache.calibration}) == 3
    assert b.step_cache.calibrating and c.step_cache.calibrating


def test_dvg_with_the_cache_runs_end_to_end():
    video = pipeline.generate(
        "tiny", "a blue square moving left", accel="dvg+cache", budget=0.5, **KW33
    )
    assert video.choices and video.step_cache.skipped > 0
    plain = pipeline.generate(
        "tiny", "a blue square moving left", accel="temporal", budget=0.5, **KW33
    )
    both = pipeline.generate(
        "tiny", "a blue square moving left", accel="dvg+cache", budget=0.5, **KW33
    )
    assert np.isfinite(both.latents).all()
    np.testing.assert_array_equal(both.latents, video.latents)  # deterministic
    assert plain.latents.shape == both.latents.shape


@pytest.mark.parametrize("accel", ["cache", "dvg+cache"])
def test_progress_runs_the_same_cached_steps(accel):
    # With a progress callback the loop runs from the host, one compiled step per call (no host
    # callback in the programs, so jax's persistent cache keeps them): the same calibration,
    # the same skips and the same latents as the one-program loop.
    kw = dict(accel=accel, **KW33) | (dict(budget=0.5) if accel == "dvg+cache" else {})
    prompt = "a blue square moving left"
    steps: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax.debug, "callback", lambda *a, **k: pytest.fail("host callback"))
        first = pipeline.generate("tiny", prompt, on_step=steps.append, **kw)
    # dvg+cache calibrates with a full run, then runs DVG with the skips: the two passes share
    # one bar over the 20 steps, in order, which completes with the last step of the second
    assert first.step_cache.calibrating
    passes = 2 if accel == "dvg+cache" else 1
    assert steps == [(k + 1) // passes - 1 for k in range(20 * passes) if k + 1 >= passes]
    path = first.step_cache.calibration
    stepped_calibration = pipeline._read_calibration(path)
    path.unlink()
    again = pipeline.generate("tiny", prompt, **kw)
    assert again.step_cache.calibrating
    np.testing.assert_allclose(pipeline._read_calibration(path), stepped_calibration, rtol=1e-5)

    quiet = pipeline.generate("tiny", prompt, **kw)
    steps.clear()
    stepped = pipeline.generate("tiny", prompt, on_step=steps.append, **kw)
    assert steps == list(range(20))
    assert stepped.step_cache.skipped == quiet.step_cache.skipped > 0
    np.testing.assert_allclose(stepped.latents, quiet.latents, atol=1e-4)


def test_the_cache_runs_sharded():
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    kw = dict(prompt=["a red circle", "a blue square"], accel="cache", **KW)
    pipeline.generate("tiny", **kw)  # calibrates
    want = pipeline.generate("tiny", **kw)
    got = pipeline.generate("tiny", mesh=mesh, strategy="fsdp_sp", **kw)
    assert got.step_cache.skipped == want.step_cache.skipped > 0
    np.testing.assert_allclose(got.latents, want.latents, atol=1e-4)


def test_an_unknown_accel_is_an_error():
    with pytest.raises(ValueError, match="accel must be one of"):
        pipeline.generate("tiny", "x", accel="fast", **KW)
