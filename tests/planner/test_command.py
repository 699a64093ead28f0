"""`vidax plan` through typer's CliRunner (on a private app wired as the CLI wires it)."""

import dataclasses

import pytest
import typer
from tests.planner._tiny import TINY_WORKLOAD_ARGS
from typer.testing import CliRunner

from vidax.cli import report_user_errors
from vidax.planner import ShardingPlan, Workload, load_plan, register


@pytest.fixture
def app():
    app = typer.Typer()
    register(app)

    @app.command("noop")  # a second command, so typer keeps `plan` as a subcommand
    def noop():
        pass

    report_user_errors(app)  # one `error:` line and exit code 2, as in `vidax`
    return app


@pytest.mark.tpu_aot
def test_plan_command_prints_a_table_and_writes_plan_json(app, tmp_path, tpu_topology):
    tpu_topology("v5e:2x2")  # skips without libtpu
    out = tmp_path / "plan.json"
    workload = Workload(**TINY_WORKLOAD_ARGS)
    args = ["plan", "--model", "tiny", "--frames", "17", "--size", "40x48"]
    args += ["--topology", "v5e:2x2", "--keep", "1", "--out", str(out)]
    args += ["--cache-dir", str(tmp_path / "cache")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "  compiled " in result.output
    assert f"AoiZora plan: {workload.describe()} on v5e:2x2" in result.output
    assert "step ms" in result.output and f"wrote {out}" in result.output
    plan = ShardingPlan.load(out)
    assert plan.topology == "v5e:2x2" and plan.model == "tiny"
    assert plan.workload == dataclasses.asdict(workload)
    mesh, strategy = load_plan(out)
    assert mesh.devices.size == 4 and strategy.name == plan.strategy
    assert plan.strategy in result.output
    # A second run finds the compiled candidate in the cache and makes the same plan.
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "from the cache" in again.output
    assert ShardingPlan.load(out) == plan


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology", "v5e:3x3"], "v5e has no 3x3 slice"),
        (["--topology", "gpu:2x2"], "unknown TPU generation 'gpu'"),
        (["--topology", "v5e:2x2", "--size", "40by48"], "--size must be HEIGHTxWIDTH"),
        (["--topology", "v5e:2x2", "--frames", "16"], "num_frames must be 4k+1"),
        (["--topology", "v5e:2x2", "--model", "nope"], "unknown model 'nope'"),
    ],
)
def test_plan_command_bad_input(app, tmp_path, args, message):
    base = ["plan", "--model", "tiny", "--out", str(tmp_path / "p.json")]
    result = CliRunner().invoke(app, base + args)
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "p.json").exists()
