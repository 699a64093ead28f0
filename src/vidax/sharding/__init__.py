"""Logical-axis sharding: models name axes, strategies map them onto mesh axes."""

from vidax.sharding.axes import ACTIVATION_AXES, MESH_AXES, PARAM_AXES
from vidax.sharding.rules import (
    STRATEGIES,
    Strategy,
    auto_mesh,
    current,
    logical_to_spec,
    make_mesh,
    param_shardings,
    shard,
    use_mesh,
)

__all__ = [
    "ACTIVATION_AXES",
    "MESH_AXES",
    "PARAM_AXES",
    "STRATEGIES",
    "Strategy",
    "auto_mesh",
    "current",
    "logical_to_spec",
    "make_mesh",
    "param_shardings",
    "shard",
    "use_mesh",
]
