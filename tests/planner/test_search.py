"""Candidate space, stage-1 estimates and pruning, the 3-stage search and the plan file."""

import dataclasses
import math

import pytest
from tests.planner._tiny import TINY_WORKLOAD_ARGS

from vidax.planner import (
    CHIPS,
    Estimate,
    ShardingCandidate,
    ShardingPlan,
    Workload,
    enumerate_candidates,
    estimate_candidate,
    plan,
    prune,
)
from vidax.planner.search import compile_candidate

WAN13 = Workload(model="wan2.1-1.3b", frames=81, height=480, width=832)
WAN14 = Workload(model="wan2.1-14b", frames=81, height=720, width=1280)


def test_workload_sizes():
    assert WAN13.tokens == 21 * 30 * 52 and WAN13.batch == 2
    assert WAN14.tokens == 21 * 45 * 80
    assert Workload(model="tiny", frames=17, height=64, width=64, cfg=False).batch == 1
    with pytest.raises(ValueError, match="4k\\+1"):
        Workload(model="wan2.1-1.3b", frames=80, height=480, width=832)
    with pytest.raises(ValueError, match="unknown model"):
        Workload(model="wan9", frames=81, height=480, width=832)
    with pytest.raises(ValueError, match="supports Wan presets"):
        Workload(model="hunyuanvideo-tiny", frames=9, height=64, width=64)


@pytest.mark.parametrize(
    ("workload", "chips", "ulysses"),
    # Ulysses splits heads over seq x tensor = chips / batch devices (batch <= 2): 12 heads take
    # neither 8 nor 16 of them, 40 heads take 8 but neither 16 nor 32.
    [(WAN13, 16, False), (WAN14, 16, True), (WAN14, 32, False)],
)
def test_candidates_obey_divisibility(workload, chips, ulysses):
    config = workload.spec.config
    candidates = enumerate_candidates(workload, chips)
    assert len(set(candidates)) == len(candidates) > 10
    for c in candidates:
        assert c.num_devices == chips and workload.batch % c.batch == 0
        assert config.num_heads % c.tensor == 0 and config.ffn_dim % c.tensor == 0
        assert (c.seq == 1) == (c.sequence == "none")
        if c.sequence == "ulysses":
            assert config.num_heads % (c.seq * c.tensor) == 0
        assert c.strategy.name.startswith({"none": "batch"}.get(c.sequence, "sp-" + c.sequence))
    modes = {c.sequence for c in candidates}
    assert ("ulysses" in modes) == ulysses
    assert {"gather", "ring"} <= modes


def test_candidate_names_and_padding():
    c = ShardingCandidate(batch=2, seq=8, tensor=1, sequence="ring", weights="fsdp")
    assert c.axis_names == ("fsdp", "seq", "tensor") and c.mesh_shape == (2, 8, 1)
    assert c.name == "sp-ring+fsdp [f2xs8xt1]" and c.strategy.ring
    assert c.padded_tokens(60) == 64 and c.padded_tokens(64) == 64


def test_no_candidate_for_the_chip_count_raises_with_numbers():
    tiny = Workload(model="tiny", frames=1, height=16, width=16)  # a few tokens, 4 heads
    assert 2 * tiny.tokens * 4 < 64  # batch x sequence x tensor cannot reach 64 chips
    with pytest.raises(ValueError, match=r"uses exactly 64 chips: the batch \(2\).*4 heads"):
        enumerate_candidates(tiny, 64)


def _estimate(name, compute, comm, memory):
    candidate = ShardingCandidate(batch=1, seq=4, tensor=1, sequence=name, weights="replicated")
    return Estimate(
        candidate=candidate,
        flops=0.0,
        hbm_bytes=0.0,
        param_bytes=memory / 2,
        activation_bytes=memory / 2,
        collective_bytes={},
        compute_time=compute,
        comm_time=comm,
        padding=0.0,
    )


def test_prune_drops_misfits_and_dominated_and_keeps_the_cheapest():
    chip = CHIPS["v5e"]
    gib = 1 << 30
    estimates = [
        _estimate("gather", 1.0, 0.2, 4 * gib),  # upper 1.2
        _estimate("ring", 1.0, 0.1, 30 * gib),  # cheapest but does not fit
        _estimate("ulysses", 1.3, 0.1, 4 * gib),  # lower 1.3 > 1.2: dominated
        _estimate("none", 1.1, 0.3, 4 * gib),  # upper 1.4, lower 1.1: kept
    ]
    pruned = prune(estimates, chip, keep=1)
    assert [e.candidate.sequence for e in pruned.fits] == ["gather", "ulysses", "none"]
    assert [e.candidate.sequence for e in pruned.undominated] == ["gather", "none"]
    assert [e.candidate.sequence for e in pruned.survivors] == ["gather"]
    assert "4 candidates, 3 fit HBM, 2 not dominated, 1 kept" in pruned.summary()
    with pytest.raises(ValueError, match=r"needs about 30\.00 GiB per chip \(15\.00 GiB of wei"):
        prune(estimates[1:2], chip, keep=1)


def test_prune_sends_near_misses_to_the_compiler_least_memory_first():
    chip = CHIPS["v5e"]  # 15.75 GiB, 14.18 GiB with the margin
    gib = 1 << 30
    estimates = [
        _estimate("gather", 1.0, 0.2, 17 * gib),
        _estimate("ring", 1.5, 0.2, 15 * gib),
        _estimate("ulysses", 1.2, 0.2, 16 * gib),
        _estimate("none", 1.0, 0.1, 25 * gib),  # beyond 1.25x HBM: dropped
    ]
    pruned = prune(estimates, chip, keep=2)
    assert pruned.tight
    assert [e.candidate.sequence for e in pruned.fits] == ["ring", "ulysses", "gather"]
    assert [e.candidate.sequence for e in pruned.survivors] == ["ring", "ulysses"]
    assert "none fit HBM with a 10% margin, 3 within 1.25x of it" in pruned.summary()
    assert not prune([*estimates[:1], _estimate("ring", 1.0, 0.1, 4 * gib)], chip, keep=1).tight


@pytest.mark.tpu_aot
def test_stage1_matches_the_compiled_program(tpu_topology):
    """The estimate's exact parts (weights, ring permutes) equal the compiled HLO's; FLOPs and
    memory are close."""
    topo = tpu_topology("v5e:2x4")
    workload = Workload(**TINY_WORKLOAD_ARGS)
    candidate = ShardingCandidate(batch=2, seq=4, tensor=1, sequence="ring", weights="replicated")
    est = estimate_candidate(workload, candidate, topo.devices, topo.chip)
    compiled = compile_candidate(workload, candidate, topo, est)
    hlo = compiled.analysis.collective_bytes()
    assert est.collective_bytes["collective-permute"] == hlo["collective-permute"]
    assert est.flops == pytest.approx(compiled.analysis.flops, rel=0.3)
    assert 0.5 < est.memory / compiled.memory < 3
    padded = candidate.padded_tokens(workload.tokens)
    assert padded > workload.tokens and est.padding == pytest.approx(1 - workload.tokens / padded)
    assert est.lower <= est.upper


@pytest.mark.tpu_aot
def test_search_ranks_compiles_few_and_writes_a_plan(tiny_search, tmp_path):
    result = tiny_search
    n = len(result.candidates)
    assert len(result.stage1.estimates) == n
    # At most `keep` (2), and at most a fifth of the candidates, get compiled.
    assert 1 <= len(result.compiled) == len(result.stage1.survivors) <= min(2, n // 5)
    assert len(result.rows) == len(result.compiled) and result.placements_scored > 2
    totals = [r.score.total for r in result.rows]
    assert totals == sorted(totals)
    for row in result.rows:  # the searched placement is never worse than jax's
        assert row.score.total <= row.default.total + 1e-12
        assert row.score.total == pytest.approx(row.score.compute + row.score.communication)
    assert result.best.score.total <= result.logical_only().default.total
    table = result.table()
    assert "step ms" in table and result.best.candidate.name in table
    assert f"{n} candidates" in table and f"compiled {len(result.compiled)}" in table

    best = result.best_plan()
    path = best.save(tmp_path / "plan.json")
    assert ShardingPlan.load(path) == best
    assert best.mesh_shape == result.best.candidate.mesh_shape
    assert [tuple(result.topology.coords[c]) for c in best.chips] == list(best.coords)
    assert math.prod(best.mesh_shape) == 8 and best.estimate["step_s"] > 0


@pytest.mark.tpu_aot
def test_search_bad_input():
    workload = Workload(**TINY_WORKLOAD_ARGS)
    with pytest.raises(ValueError, match="v5e has no 3x3 slice"):
        plan(workload, "v5e:3x3")
    with pytest.raises(ValueError, match="unknown TPU generation 'tpu9'"):
        plan(workload, "tpu9:2x2")
    wrong = ShardingCandidate(batch=2, seq=2, tensor=1, sequence="ring", weights="replicated")
    with pytest.raises(ValueError, match="uses 4 chips, v5e:2x4 has 8"):
        plan(workload, "v5e:2x4", candidates=[wrong])


@pytest.mark.tpu_aot
def test_model_too_big_for_the_slice_raises_with_numbers():
    # Wan 14B in bf16 is ~28 GB of weights: one v5e chip (15.75 GiB) cannot hold it.
    small = dataclasses.replace(WAN14, frames=1, height=64, width=64)
    with pytest.raises(ValueError, match=r"no candidate fits in v5e HBM \(15\.75 GiB.*GiB of w"):
        plan(small, "v5e:1x1")


@pytest.mark.tpu_aot
def test_image_to_video_and_two_expert_presets_are_planned(tpu_topology, monkeypatch):
    """Issue 21 item 6: the new Wan presets trace with their image inputs; two experts hold both
    weights but a step runs (and is priced as) one of them."""
    from vidax.models import get, registry

    topo = tpu_topology("v5e:2x4")
    candidate = ShardingCandidate(batch=2, seq=4, tensor=1, sequence="gather", weights="replicated")
    args = dict(frames=17, height=64, width=64)
    for model in ("wan2.1-i2v-tiny", "wan2.2-ti2v-tiny"):
        est = estimate_candidate(Workload(model=model, **args), candidate, topo.devices, topo.chip)
        assert est.flops > 0 and est.param_bytes > 0
    one = dataclasses.replace(get("wan2.2-a14b-tiny"), name="one-expert", boundary_ratio=None)
    monkeypatch.setitem(registry._registry()[0], "one-expert", one)
    two = estimate_candidate(
        Workload(model="wan2.2-a14b-tiny", **args), candidate, topo.devices, topo.chip
    )
    single = estimate_candidate(
        Workload(model="one-expert", **args), candidate, topo.devices, topo.chip
    )
    assert two.param_bytes == 2 * single.param_bytes
    assert two.flops == pytest.approx(single.flops, rel=0.02)
    assert two.hbm_bytes == pytest.approx(single.hbm_bytes, rel=0.02)
