"""`allocate` and `sources` never know whether a platform is the simulator: nothing under them
imports `gpupool.sim` (the simulator's actuator lives in `gpupool.sim.actuator`)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpupool

PACKAGE = Path(gpupool.__file__).resolve().parent


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-node.level]
                names.append(".".join(base + ((node.module,) if node.module else ())))
                names += [".".join(base + ((node.module,) if node.module else ()) + (a.name,)) for a in node.names]
            elif node.module:
                names.append(node.module)
                names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_allocate_and_sources_never_import_the_simulator():
    files = sorted((PACKAGE / "allocate").rglob("*.py")) + sorted((PACKAGE / "sources").rglob("*.py"))
    assert len(files) > 10
    offenders = {str(f.relative_to(PACKAGE)): [n for n in _imports(f) if n == "gpupool.sim" or n.startswith("gpupool.sim.")]
                 for f in files}
    assert {f: n for f, n in offenders.items() if n} == {}


def test_the_scan_sees_every_form_of_import(tmp_path):
    fake = tmp_path / "x.py"
    fake.write_text("import gpupool.sim\nfrom gpupool.sim.world import World\n"
                    "def late():\n    from gpupool import sim\n")
    names = _imports(fake)
    assert {"gpupool.sim", "gpupool.sim.world", "gpupool.sim.world.World"} <= set(names)
