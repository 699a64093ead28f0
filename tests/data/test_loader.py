import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vidax.data import (
    ClipLoader,
    LoaderConfig,
    batch_rows,
    caption,
    clip_at,
    parse_caption,
    shard_batch,
)

CONFIG = LoaderConfig(batch_size=8, num_frames=5, height=32, width=32)


def _assert_same(a: dict, b: dict):
    np.testing.assert_array_equal(a["video"], b["video"])
    np.testing.assert_array_equal(a["index"], b["index"])
    assert a["caption"] == b["caption"]
    assert a["spec"] == b["spec"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"batch_size": 2, "num_frames": 0},
        {"batch_size": 2, "height": 8},
        {"batch_size": 2, "min_objects": 3, "max_objects": 2},
        {"batch_size": 2, "pan_probability": -0.1},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        LoaderConfig(**kwargs)


def test_batch_contents():
    batch = next(ClipLoader(CONFIG, seed=3))
    assert batch["video"].shape == (8, 5, 32, 32, 3) and batch["video"].dtype == np.float32
    assert batch["video"].min() >= -1.0 and batch["video"].max() <= 1.0
    np.testing.assert_array_equal(batch["index"], np.arange(8))
    assert len(batch["caption"]) == len(batch["spec"]) == 8
    for i, (spec, text) in enumerate(zip(batch["spec"], batch["caption"], strict=True)):
        assert text == caption(spec)
        assert [o.colour for o in parse_caption(text)] == [o.colour for o in spec.objects]
        want_spec, want_video = clip_at(CONFIG, 3, i)
        assert spec == want_spec
        np.testing.assert_array_equal(batch["video"][i], want_video)
    assert len(set(batch["caption"])) > 1


def test_streams_are_seeded():
    a, b, c = ClipLoader(CONFIG, seed=1), ClipLoader(CONFIG, seed=1), ClipLoader(CONFIG, seed=2)
    for _ in range(2):
        x, y, z = next(a), next(b), next(c)
        _assert_same(x, y)
        assert x["caption"] != z["caption"]


def test_resume_gives_the_identical_next_batch():
    loader = ClipLoader(CONFIG, seed=11)
    seen = [next(loader) for _ in range(3)]
    state = loader.get_state()
    assert state == {"seed": 11, "step": 3}
    expected = next(loader)

    resumed = ClipLoader(CONFIG, seed=0)
    resumed.set_state(state)
    _assert_same(next(resumed), expected)
    _assert_same(next(ClipLoader(CONFIG, seed=11, step=3)), expected)
    # Nothing lost or repeated: clip indices run on without gaps.
    indices = np.concatenate([b["index"] for b in [*seen, expected]])
    np.testing.assert_array_equal(indices, np.arange(32))


def test_bad_state_is_rejected():
    with pytest.raises(ValueError):
        ClipLoader(CONFIG, seed=-1)
    with pytest.raises(ValueError):
        ClipLoader(CONFIG).set_state({"seed": 0, "step": -2})
    with pytest.raises(ValueError):
        clip_at(CONFIG, 0, -1)


def test_shard_batch_splits_over_data_and_fsdp():
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"))
    loader = ClipLoader(CONFIG, seed=5, mesh=mesh)
    assert batch_rows(mesh, 8) == range(8)  # one process holds every row
    batch = next(loader)
    placed = shard_batch(batch, mesh)
    video = placed["video"]
    assert video.shape == (8, 5, 32, 32, 3)
    assert video.sharding.spec == P(("data", "fsdp"), None, None, None, None)
    assert placed["index"].sharding.spec == P(("data", "fsdp"))
    shards = sorted(video.addressable_shards, key=lambda s: s.index[0].start)
    assert len(shards) == 8 and all(s.data.shape == (1, 5, 32, 32, 3) for s in shards)
    for row, shard in enumerate(shards):
        np.testing.assert_array_equal(np.asarray(shard.data)[0], batch["video"][row])
    assert placed["caption"] is batch["caption"]


def test_shard_batch_ignores_absent_axes_and_replicates_over_others():
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    video = shard_batch(next(ClipLoader(CONFIG, mesh=mesh)), mesh)["video"]
    assert video.sharding.spec == P(("data",), None, None, None, None)
    assert {s.data.shape[0] for s in video.addressable_shards} == {4}


def test_uneven_batch_is_rejected():
    mesh = jax.make_mesh((8,), ("data",))
    config = LoaderConfig(batch_size=6, num_frames=2, height=16, width=16)
    with pytest.raises(ValueError, match="split"):
        ClipLoader(config, mesh=mesh)
    with pytest.raises(ValueError, match="split"):
        shard_batch(next(ClipLoader(config)), mesh)
