"""`--accel` / `--budget` validation and the pipeline's accel path."""

import numpy as np
import pytest

from vidax import pipeline
from vidax.dvg.command import generate_kwargs
from vidax.models.registry import get


def test_generate_kwargs_validate():
    assert generate_kwargs("dvg", 0.3) == {"accel": "dvg", "budget": 0.3}
    # No budget: the pipeline picks each mode's default (DVG's token-steps, the cache's forwards).
    assert generate_kwargs("cache", None) == {"accel": "cache", "budget": None}
    assert generate_kwargs("dvg+cache", 0.4) == {"accel": "dvg+cache", "budget": 0.4}
    with pytest.raises(ValueError, match="--accel must be one of"):
        generate_kwargs("fast", 0.3)
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="--budget must be in"):
            generate_kwargs("dvg", bad)


def test_pipeline_generate_with_accel():
    transformer = get("tiny").build(seed=0)
    kw = dict(
        prompt="a red circle moving right",
        steps=3,
        seed=3,
        decode_frames=False,
        transformer=transformer,
    )
    base = pipeline.generate("tiny", **kw)
    # the tiny preset rules spatial stages out of DVG (dvg_spatial=False): asked for, they warn
    with pytest.warns(UserWarning, match="rules out"):
        fast = pipeline.generate("tiny", accel="spatial", budget=0.6, **kw)
    assert fast.latents.shape == base.latents.shape and np.all(np.isfinite(fast.latents))
    assert np.max(np.abs(fast.latents - base.latents)) > 1e-4  # a different sampler really ran
    # The video says what DVG chose and how long the denoising took; the base sampler does not.
    assert base.choices is None and base.denoise_seconds > 0
    (choice,) = fast.choices
    assert choice.family == "spatial" and choice.schedule.stages[-1].factors == (1, 1)
    assert 0 < choice.cost < 1
    with pytest.raises(ValueError, match="accel must be one of"):
        pipeline.generate("tiny", accel="bogus", **kw)
