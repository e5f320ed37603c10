"""Data flows one way: sources -> staging -> detect -> forecast -> allocate. Checked on the
source text (every import, also those inside functions), so a cycle cannot hide in a
function body."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[3] / "include" / "gpupool"
STAGES = ["sources", "staging", "detect", "forecast", "allocate"]
#: what no stage may import: the orchestration and the views built on top of the stages
ABOVE = {"pipeline", "cli", "poolview", "report", "airflow_glue"}


def _imports(path: Path) -> set[str]:
    """The gpupool modules a file imports, as dotted names below `gpupool`."""
    out = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n[len("gpupool."):] for n in names if n.startswith("gpupool.")}
    return out


def _stage_files(stage: str) -> list[Path]:
    return sorted((PKG / stage).rglob("*.py"))


def test_no_stage_imports_a_later_stage_or_the_pipeline():
    bad = []
    for i, stage in enumerate(STAGES):
        later = set(STAGES[i + 1:])
        for path in _stage_files(stage):
            for mod in _imports(path):
                top = mod.split(".")[0]
                if top in later or top in ABOVE:
                    bad.append(f"{path.relative_to(PKG)} imports gpupool.{mod}")
    assert bad == []


def test_staging_knows_no_stage():
    bad = [f"{p.relative_to(PKG)} imports gpupool.{m}" for p in _stage_files("staging") for m in _imports(p)
           if m.split(".")[0] in set(STAGES) - {"staging"} | ABOVE | {"sim"}]
    assert bad == []


def test_the_planning_service_reads_staging_through_reads_only():
    mods = _imports(PKG / "allocate" / "service.py")
    assert "pipeline" not in {m.split(".")[0] for m in mods}
    assert "staging.reads" in mods


def test_the_checker_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from gpupool.pipeline import read_inventory\n    import gpupool.report\n")
    assert _imports(f) == {"pipeline", "pipeline.read_inventory", "report"}
