"""Composed strategies (the planner's candidate space) and uneven (padded) sharding."""

import itertools

import jax
import pytest
from jax.sharding import PartitionSpec as P

from vidax.sharding.rules import (
    SEQUENCE_MODES,
    WEIGHT_MODES,
    compose_strategy,
    get_strategy,
    logical_to_spec,
)


@pytest.mark.parametrize(
    ("sequence", "tensor", "weights"),
    list(itertools.product(SEQUENCE_MODES, (False, True), WEIGHT_MODES)),
)
def test_composed_names_round_trip(sequence, tensor, weights):
    strategy = compose_strategy(sequence, tensor=tensor, weights=weights)
    assert get_strategy(strategy.name) == strategy
    params, acts = dict(strategy.params), dict(strategy.activations)
    assert acts["batch"] == ("data", "fsdp")
    assert ("heads" in params) == tensor == ("mlp" in acts)
    assert (params.get("embed") == ("fsdp", "seq")) == (weights == "fsdp")
    assert strategy.ring == (sequence == "ring")
    assert bool(strategy.pad) == (sequence != "none")
    if sequence == "ulysses":
        assert acts["attn_tokens"] is None
        assert acts["attn_heads"] == (("seq", "tensor") if tensor else "seq")
    if sequence in ("gather", "ring"):
        assert acts["attn_tokens"] == "seq"
        assert acts["kv_tokens"] == ("seq" if sequence == "ring" else None)


def test_composed_bad_input():
    with pytest.raises(ValueError, match="unknown sequence mode"):
        compose_strategy("spiral")
    with pytest.raises(ValueError, match="unknown weight mode"):
        compose_strategy("ring", weights="zero")
    # Flags in another order, twice, or unknown do not name a strategy.
    for name in ("sp-ring+fsdp+tp", "sp-ring+tp+tp", "sp-ring+pp", "sp-spiral"):
        with pytest.raises(ValueError, match="composed name"):
            get_strategy(name)
    assert get_strategy("ulysses").name == "ulysses"  # presets keep their meaning


def test_padded_axes_shard_unevenly():
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    rules = (("batch", "data"), ("tokens", "seq"))
    # 30 tokens over 4: padded to 32 when allowed, replicated otherwise.
    assert logical_to_spec(("batch", "tokens"), rules, mesh, (2, 30), pad=("tokens",)) == P(
        "data", "seq"
    )
    assert logical_to_spec(("batch", "tokens"), rules, mesh, (2, 30)) == P("data", None)
    # Fewer tokens than shards: never sharded (some shard would be empty).
    assert logical_to_spec(("batch", "tokens"), rules, mesh, (2, 3), pad=("tokens",)) == P(
        "data", None
    )
    # Padding is for activations only: the batch still has to divide.
    assert logical_to_spec(("batch", "tokens"), rules, mesh, (3, 64), pad=("tokens",)) == P(
        None, "seq"
    )
