"""`vidax plan` through typer's CliRunner (on a private app: the CLI registers it itself)."""

import pytest
import typer
from typer.testing import CliRunner

from vidax.planner import Plan, load_plan, register


@pytest.fixture
def app():
    app = typer.Typer()
    register(app)

    @app.command("noop")  # a second command, so typer keeps `plan` as a subcommand
    def noop():
        pass

    return app


@pytest.mark.tpu_aot
def test_plan_command_prints_a_table_and_writes_plan_json(app, tmp_path, tpu_topology):
    tpu_topology("v5e:2x2")  # skips without libtpu
    out = tmp_path / "plan.json"
    args = ["plan", "--model", "tiny", "--frames", "17", "--size", "64x48"]
    args += ["--topology", "v5e:2x2", "--keep", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "AoiZora plan: tiny 17x64x48 cfg (2x60 tokens) on v5e:2x2" in result.output
    assert "step ms" in result.output and f"wrote {out}" in result.output
    plan = Plan.load(out)
    assert plan.topology == "v5e:2x2" and plan.model == "tiny"
    assert plan.workload["height"] == 64 and plan.workload["width"] == 48
    mesh, strategy = load_plan(out)
    assert mesh.devices.size == 4 and strategy.name == plan.strategy
    assert plan.strategy in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topology", "v5e:3x3"], "v5e has no 3x3 slice"),
        (["--topology", "gpu:2x2"], "unknown TPU generation 'gpu'"),
        (["--topology", "v5e:2x2", "--size", "64by48"], "--size must be HEIGHTxWIDTH"),
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
