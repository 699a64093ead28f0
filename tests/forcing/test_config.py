"""ForcingConfig / CacheLayout: derived sizes and clear errors for bad cache and budget settings."""

from __future__ import annotations

import numpy as np
import pytest

from vidax.forcing import ForcingConfig
from vidax.sampling import shift_sigmas

SPARSE = dict(
    attention="sparse",
    window_frames=3,
    memory_blocks=5,
    local_topk=4,
    memory_topk=3,
    compressed_tokens=6,
)


def test_derived_sizes():
    cfg = ForcingConfig(**SPARSE)
    lay = cfg.layout((4, 4))
    assert lay.tokens_per_frame == 16 and lay.blocks_per_frame == 2 and lay.chunk_blocks == 6
    assert lay.sink_slots == 6 and lay.memory_start == 6 and lay.window_start == 11
    assert lay.num_slots == 6 + 5 + 6
    assert lay.max_selected == 6 + 4 + 3
    assert lay.cache_tokens() == 17 * 8 + 6 and lay.peak_tokens() == 17 * 8 + 6 + 48
    assert cfg.horizon == 3 + 3 + 3
    dense = ForcingConfig()
    assert dense.horizon == 18 and dense.layout((4, 4)).peak_tokens() == 21 * 16
    expected = shift_sigmas(np.array([1.0, 0.75, 0.5, 0.25]), 5.0)
    np.testing.assert_allclose(cfg.sigmas, np.append(expected, 0), rtol=1e-6)
    assert cfg.num_chunks(21) == 7
    # Context span: sink + window (+ the memory's reach; None when it has none).
    assert dense.context_frames == 18 and cfg.context_frames is None
    assert ForcingConfig(**SPARSE, memory_frames=12).context_frames == 3 + 3 + 12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(chunk_frames=0), "chunk_frames"),
        (dict(window_frames=4), "multiple of chunk_frames"),
        (dict(sink_frames=2), "multiple of chunk_frames"),
        (dict(window_frames=0), "at least one chunk"),
        (dict(timesteps=(500.0, 750.0)), "descending"),
        (dict(timesteps=()), "empty"),
        (dict(context_timestep=300.0), "context_timestep"),
        (dict(attention="flash"), "attention"),
        (dict(memory_blocks=4), "dense attention takes no sparse budgets"),
        (dict(memory_frames=6), "dense attention takes no sparse budgets"),
        ({**SPARSE, "memory_frames": 2}, "memory_frames=2 must be 0 or at least chunk_frames"),
        ({**SPARSE, "local_topk": 0}, "local_topk"),
        ({**SPARSE, "memory_topk": 6}, "larger than the memory budget"),
        (dict(salience_decay=1.0), "salience_decay"),
        (dict(shift=0.0), "shift"),
        (dict(pbsa_backend="cuda"), "pbsa_backend"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ForcingConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, grid, match",
    [
        ({**SPARSE, "local_topk": 7}, (4, 4), "larger than the local window"),
        ({**SPARSE, "memory_blocks": 7, "memory_topk": 1}, (4, 4), "larger than the window"),
        (dict(query_tile=5), (4, 4), "query_tile"),
        ({**SPARSE, "compressed_tokens": 4}, (4, 4), "at least the 6 blocks"),
    ],
)
def test_layout_errors(kwargs, grid, match):
    cfg = ForcingConfig(**kwargs)
    with pytest.raises(ValueError, match=match):
        cfg.layout(grid)


def test_partial_last_block():
    """Any block size: a frame that it does not divide ends in a partial (padded) block."""
    # Wan 2.1 480p: 30 x 52 = 1560 tokens per latent frame; blocks of 64 = 24 full + one of 24.
    lay = ForcingConfig(block_size=64).layout((30, 52))
    assert lay.blocks_per_frame == 25 and lay.last_block_tokens == 24 and lay.ragged
    assert lay.chunk_blocks == 75 and lay.chunk_tokens == 3 * 1560
    assert lay.cache_tokens() == 18 * 25 * 64  # the padding is stored
    even = ForcingConfig(block_size=60).layout((30, 52))
    assert even.blocks_per_frame == 26 and even.last_block_tokens == 60 and not even.ragged
    # A block larger than a frame: one partial block per frame.
    assert ForcingConfig(block_size=5).layout((2, 2)).blocks_per_frame == 1


def test_chunk_must_divide_frames():
    with pytest.raises(ValueError, match="cannot be cut into chunks of 3"):
        ForcingConfig().num_chunks(22)
