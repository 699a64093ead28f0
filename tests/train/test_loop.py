"""The shared training loop: resume determinism, log continuity, checkpoints, data parallel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.sharding import make_mesh
from vidax.train.checkpointing import Checkpointer
from vidax.train.loop import LoopConfig, make_step, read_log, run
from vidax.train.optim import OptimConfig, make_optimizer
from vidax.train.step import init_state


class _Regression:
    """Resumable batches of a noisy linear-regression problem; batch s = f(seed, s)."""

    def __init__(self, batch_size=8, seed=0):
        self.batch_size, self.seed, self.step = batch_size, seed, 0

    def __next__(self):
        rng = np.random.default_rng([self.seed, self.step])
        self.step += 1
        x = rng.normal(size=(self.batch_size, 4)).astype(np.float32)
        y = x @ np.arange(1.0, 5.0, dtype=np.float32)[:, None]
        return {"x": x, "y": y, "step": np.full((self.batch_size,), self.step - 1, np.int32)}

    def get_state(self):
        return {"seed": self.seed, "step": self.step}

    def set_state(self, state):
        self.seed, self.step = state["seed"], state["step"]


def _setup(seed=0):
    model = nnx.Linear(4, 1, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = make_optimizer(OptimConfig(lr=0.05, warmup=2, ema_decay=0.9))

    def loss_fn(params, batch, key):
        pred = nnx.merge(graphdef, params)(batch["x"])
        noise = 0.01 * jax.random.normal(key, pred.shape)  # uses the per-step key
        return jnp.mean((pred + noise - batch["y"]) ** 2), {"seen": jnp.mean(batch["step"])}

    step = make_step(loss_fn, optimizer, ema_decay=0.9, seed=seed)
    return init_state(params, optimizer), step


def _flat(state):
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(state["params"]))])


def test_resume_replays_the_uninterrupted_run(tmp_path, capsys):
    state, step = _setup()
    full = run(tmp_path / "a", state, step, _Regression(), LoopConfig(steps=6, checkpoint_every=2))
    full_log = read_log(tmp_path / "a")
    assert [r["step"] for r in full_log] == [1, 2, 3, 4, 5, 6]

    # Stop after 4 steps (checkpoint at 4), then resume to 6 with a fresh state and iterator.
    state, step = _setup()
    run(tmp_path / "b", state, step, _Regression(), LoopConfig(steps=4, checkpoint_every=2))
    state, step = _setup(seed=0)
    batches = _Regression()
    capsys.readouterr()
    resumed = run(tmp_path / "b", state, step, batches, LoopConfig(steps=6, checkpoint_every=2))
    assert "resuming from step 4 of 6" in capsys.readouterr().err
    assert batches.step == 6  # continued from the saved loader position, not from 0
    log = read_log(tmp_path / "b")
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert [r["seen"] for r in log] == [float(s) for s in range(6)]  # each batch exactly once
    np.testing.assert_array_equal([r["loss"] for r in log], [r["loss"] for r in full_log])
    np.testing.assert_array_equal(_flat(resumed), _flat(full))
    assert int(resumed["step"]) == 6


def test_log_is_cut_back_to_the_checkpoint(tmp_path):
    state, step = _setup()
    run(tmp_path, state, step, _Regression(), LoopConfig(steps=5, checkpoint_every=2))
    # A run killed after step 5 was logged but before its checkpoint: drop the last one.
    Checkpointer(tmp_path / "checkpoints").close()
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "5")
    before = read_log(tmp_path)
    state, step = _setup()
    run(tmp_path, state, step, _Regression(), LoopConfig(steps=5, checkpoint_every=2))
    after = read_log(tmp_path)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5]
    assert after[:4] == before[:4]
    assert after[4]["loss"] == before[4]["loss"]


def test_finished_run_is_not_retrained(tmp_path):
    state, step = _setup()
    run(tmp_path, state, step, _Regression(), LoopConfig(steps=2, checkpoint_every=1))
    calls = []
    state, _ = _setup()
    out = run(
        tmp_path,
        state,
        lambda s, b: calls.append(1),
        _Regression(),
        LoopConfig(steps=2),
    )
    assert not calls and int(out["step"]) == 2


def test_checkpointer_keeps_the_newest_and_raises_without_one(tmp_path):
    c = Checkpointer(tmp_path, keep=2, asynchronous=False)
    tree = {"a": jnp.arange(3.0)}
    with pytest.raises(FileNotFoundError):
        c.restore(tree)
    for s in (1, 2, 3):
        c.save(s, {"a": tree["a"] + s}, {"s": s})
    assert c.all_steps() == [2, 3]
    restored, meta, step = c.restore(tree)
    assert step == 3 and meta == {"s": 3}
    np.testing.assert_array_equal(np.asarray(restored["a"]), [3.0, 4.0, 5.0])
    with pytest.raises(ValueError):
        Checkpointer(tmp_path / "x", keep=0)


def test_data_parallel_step_matches_single_device(tmp_path):
    assert jax.device_count() >= 8  # conftest forces 8 CPU devices
    mesh = make_mesh((8,), ("data",))
    state, step = _setup()
    single = run(tmp_path / "one", state, step, _Regression(), LoopConfig(steps=3))
    state, step = _setup()
    sharded = run(tmp_path / "dp", state, step, _Regression(), LoopConfig(steps=3), mesh=mesh)
    assert sharded["params"]["kernel"].sharding.is_fully_replicated
    assert len(sharded["params"]["kernel"].sharding.device_set) == 8
    np.testing.assert_allclose(
        [r["loss"] for r in read_log(tmp_path / "dp")],
        [r["loss"] for r in read_log(tmp_path / "one")],
        rtol=1e-5,
    )
    np.testing.assert_allclose(_flat(sharded), _flat(single), rtol=1e-5, atol=1e-6)


def test_loop_config_rejects_bad_values():
    with pytest.raises(ValueError):
        LoopConfig(steps=0)
    with pytest.raises(ValueError):
        LoopConfig(steps=3, checkpoint_every=0)


def test_max_seconds_stops_early_and_saves_as_at_the_end(tmp_path, capsys):
    state, step = _setup()
    saved = []
    config = LoopConfig(steps=50, checkpoint_every=100, max_seconds=1e-9)
    out = run(
        tmp_path, state, step, _Regression(), config, on_checkpoint=lambda s, _: saved.append(s)
    )
    # The first step already spends the budget: one step, then the final save and export.
    assert int(out["step"]) == 1 and saved == [1]
    assert [r["step"] for r in read_log(tmp_path)] == [1]
    assert Checkpointer(tmp_path / "checkpoints").latest_step() == 1
    assert "stopped at step 1 of 50" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_seconds must be > 0"):
        LoopConfig(steps=5, max_seconds=0)


def test_a_run_that_is_not_resumable_writes_no_checkpoints(tmp_path):
    state, step = _setup()
    saved = []
    config = LoopConfig(steps=4, checkpoint_every=2, resumable=False)
    run(tmp_path, state, step, _Regression(), config, on_checkpoint=lambda s, _: saved.append(s))
    assert saved == [2, 4] and not (tmp_path / "checkpoints").exists()
    # Run again: nothing to resume from, so it trains from step 0 again.
    state, step = _setup()
    run(tmp_path, state, step, _Regression(), config)
    assert [r["step"] for r in read_log(tmp_path)] == [1, 2, 3, 4]
