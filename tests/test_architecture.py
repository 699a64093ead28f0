"""The import graph keeps the floors of docs/architecture.md: no package imports upward."""

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vidax"


def _floors() -> dict[str, int]:
    """package -> floor, from the table in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    floors = {}
    for floor, names in re.findall(r"^\| (\d+) \| ([^|]+) \|$", text, flags=re.M):
        for name in names.split(","):
            floors[name.strip().replace("\\_", "_")] = int(floor)
    return floors


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vidax"


def _imports(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the modules where it happens (every import,
    function-local ones too; `vidax` itself excluded)."""
    edges = defaultdict(list)
    for path in src.rglob("*.py"):
        module = ".".join(("vidax", *path.relative_to(src).with_suffix("").parts))
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
                if node.module == "vidax":
                    targets = [f"vidax.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("vidax.") and _package(target) != _package(module):
                    edges[_package(module), _package(target)].append(module)
    return edges


def test_every_package_has_a_floor():
    packages = {p.stem if p.is_file() else p.name for p in SRC.iterdir()}
    packages = {p for p in packages if p not in ("__init__", "assets", "__pycache__")}
    packages = {p for p in packages if (SRC / p).is_dir() or (SRC / f"{p}.py").is_file()}
    assert packages - set(_floors()) == set(), "give new packages a floor in docs/architecture.md"
    assert set(_floors()) - packages == set(), "docs/architecture.md names a package that is gone"


def test_no_package_imports_upward_or_sideways():
    floors = _floors()
    wrong = [
        f"{a} (floor {floors[a]}) imports {b} (floor {floors[b]}) in {sorted(set(where))}"
        for (a, b), where in sorted(_imports().items())
        if floors[b] >= floors[a]
    ]
    assert wrong == []


def test_only_front_ends_and_evaluation_import_the_pipeline():
    importers = {a for (a, b) in _imports() if b == "pipeline"}
    assert importers <= {"cli", "serve", "eval"}


def test_the_checker_sees_function_local_imports(tmp_path):
    # Upward imports hide inside functions: the graph must count them.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "spec.py").write_text(
        "import vidax.nn\n\ndef f():\n    from vidax.pipeline import generate\n"
    )
    (tmp_path / "cli.py").write_text("from vidax import models, pipeline\n")
    edges = _imports(tmp_path)
    assert set(edges) == {
        ("models", "nn"),
        ("models", "pipeline"),
        ("cli", "models"),
        ("cli", "pipeline"),
    }
    assert edges["models", "pipeline"] == ["vidax.models.spec"]
