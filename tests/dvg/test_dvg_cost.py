"""The analytic FLOP model against the compiled forward's HLO (dots counted through loops)."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from vidax.dvg import Schedule, relative_cost, schedule_flops, step_flops
from vidax.models.registry import get
from vidax.planner.hlo import analyze_hlo


def _hlo_flops(spec, latent, batch=1):
    model = spec.build(seed=0)
    graphdef, state = nnx.split(model)
    c = spec.config
    x = jax.ShapeDtypeStruct((batch, *latent, c.in_channels), jnp.float32)
    t = jax.ShapeDtypeStruct((batch,), jnp.float32)
    if spec.family == "wan":
        cond = {"context": jax.ShapeDtypeStruct((batch, c.text_len, c.text_dim), jnp.float32)}
    else:
        cond = {
            "text": jax.ShapeDtypeStruct((batch, c.text_len, c.text_dim), jnp.float32),
            "text_mask": jax.ShapeDtypeStruct((batch, c.text_len), jnp.bool_),
            "pooled": jax.ShapeDtypeStruct((batch, c.pooled_dim), jnp.float32),
            "guidance": jax.ShapeDtypeStruct((batch,), jnp.float32),
        }

    def forward(state, x, t, cond):
        return nnx.merge(graphdef, state)(x, t, **cond)

    compiled = jax.jit(forward).lower(state, x, t, cond).compile()
    return analyze_hlo(compiled.as_text()).flops


@pytest.mark.parametrize(
    "name, latent",
    [("tiny", (5, 8, 8)), pytest.param("hunyuanvideo-tiny", (3, 4, 4), marks=pytest.mark.slow)],
)
def test_step_flops_match_the_compiled_forward(name, latent):
    spec = get(name)
    want = _hlo_flops(spec, latent)
    got = step_flops(spec.config, latent)
    # Only the timestep/pooled embedders and modulation projections are left out.
    assert got == pytest.approx(want, rel=0.05)
    assert step_flops(spec.config, latent, batch=2) == pytest.approx(2 * got)


def test_relative_cost_of_reduced_schedules():
    config = get("wan2.1-1.3b").config
    latent = (21, 60, 104)
    assert relative_cost(Schedule.full(10), config, latent) == pytest.approx(1.0)
    half = relative_cost(Schedule.of([(1, 2, 5), (1, 1, 5)]), config, latent)
    # a quarter of the tokens for half the steps: attention is quadratic, so below 5/8
    assert 0.5 < half < 0.625
    total = schedule_flops(Schedule.of([(2, 2, 4), (1, 1, 6)]), config, latent)
    assert total < 10 * step_flops(config, latent)
