"""The package installs: the wheel `pip install .` builds names what the code imports.

The wheel is built from a copy of the project (pyproject.toml, README.md, include/) with the
build backend of the environment (`--no-build-isolation --no-index`: no network), and its
metadata is read back: every top-level outside import of include/gpupool must be a
``Requires-Dist`` of the wheel, every Airflow provider that dags/ and plugins/ import must be in
the ``airflow`` extra, each declared range must hold the version constraints.txt pins, and
every file of the package (migrations included) must be in the wheel.
"""

from __future__ import annotations

import ast
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from functools import lru_cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
PKG = ROOT / "include" / "gpupool"
#: import names whose distribution is named otherwise
IMPORT_TO_DIST = {"yaml": "pyyaml", "sklearn": "scikit-learn", "openstack": "openstacksdk", "pynvml": "nvidia-ml-py",
                  "psycopg": "psycopg"}
#: runtime dependencies the code reaches without an import statement: staging's PostgreSQL
#: driver, loaded by SQLAlchemy for ``postgresql+psycopg://`` URLs
NOT_IMPORTED = {"psycopg"}
#: what dags/ and plugins/ import that Airflow itself brings (its API server is FastAPI)
WITH_AIRFLOW = {"fastapi"}
#: the oldest setuptools that reads pyproject.toml's SPDX ``license`` string
MIN_SETUPTOOLS = Version("77")


@lru_cache(maxsize=None)
def _outside_imports(root: Path) -> frozenset[str]:
    """Top-level names of the non-stdlib, non-gpupool modules any file under ``root`` imports
    (lazy imports inside functions included; relative imports are the package's own)."""
    names: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    top = {n.split(".")[0] for n in names}
    return frozenset(n for n in top if n not in sys.stdlib_module_names and n not in ("gpupool", "__future__"))


def _provider_imports(*roots: Path) -> set[str]:
    """``x`` for every ``airflow.providers.x`` imported under ``roots``."""
    found = set()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                found |= {m.split(".")[2] for m in mods if m.startswith("airflow.providers.") and m.count(".") >= 2}
    return found


@lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _dist_name(import_name: str) -> str:
    if import_name in IMPORT_TO_DIST:
        return canonicalize_name(IMPORT_TO_DIST[import_name])
    dists = _installed().get(import_name) or [import_name]
    return canonicalize_name(dists[0])


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = Version(next(iter(req.specifier)).version)
    return pins


def _built_wheel(tmp: Path) -> Path:
    try:
        have = Version(importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        have = None
    if have is None or have < MIN_SETUPTOOLS:
        pytest.fail(f"setuptools {have} cannot build the wheel (needs >= {MIN_SETUPTOOLS}): "
                    f"pip install -r requirements.txt -c constraints.txt")
    src, out = tmp / "src", tmp / "dist"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "include", src / "include", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (wheel,) = out.glob("gpupool-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _built_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(name).decode())


def _requires(metadata) -> list[Requirement]:
    return [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]


def _core(metadata) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in _requires(metadata) if r.marker is None}


def _extra(metadata, extra: str) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in _requires(metadata)
            if r.marker is not None and r.marker.evaluate({"extra": extra})}


def test_scan_sees_lazy_and_renamed_imports(tmp_path):
    """The scan is what the other tests stand on: it finds imports inside functions and maps
    renamed distributions."""
    (tmp_path / "m.py").write_text("import os\nimport yaml\ndef f():\n    from sklearn.svm import SVR\n"
                                   "    import openstack.connection\nfrom . import sibling\n")
    found = _outside_imports(tmp_path)
    assert found == {"yaml", "sklearn", "openstack"}
    assert {_dist_name(n) for n in found} == {"pyyaml", "scikit-learn", "openstacksdk"}


def test_every_runtime_import_is_a_declared_dependency(metadata):
    core = _core(metadata)
    needed = {_dist_name(n): n for n in _outside_imports(PKG)}
    missing = sorted(f"{dist} (import {imp})" for dist, imp in needed.items() if dist not in core)
    assert not missing, f"include/gpupool imports what pyproject.toml's [project.dependencies] does not name: {missing}"
    for dist in NOT_IMPORTED:
        assert canonicalize_name(dist) in core, f"{dist} is needed at runtime but not declared"


def test_no_declared_dependency_is_unused(metadata):
    """A dependency nothing imports (and that is not a known runtime-only one) is stale."""
    needed = {_dist_name(n) for n in _outside_imports(PKG)} | {canonicalize_name(d) for d in NOT_IMPORTED}
    stale = sorted(set(_core(metadata)) - needed)
    assert not stale, f"[project.dependencies] names what include/gpupool never imports: {stale}"


def test_airflow_extra_names_the_providers_the_dags_import(metadata):
    airflow = _extra(metadata, "airflow")
    assert "apache-airflow" in airflow
    providers = _provider_imports(ROOT / "dags", ROOT / "plugins")
    missing = sorted(p for p in providers if canonicalize_name(f"apache-airflow-providers-{p}") not in airflow)
    assert not missing, f"dags/ or plugins/ import providers the `airflow` extra lacks: {missing}"
    core = _core(metadata)
    other = _outside_imports(ROOT / "dags") | _outside_imports(ROOT / "plugins")
    loose = sorted(n for n in other - {"airflow"} - WITH_AIRFLOW if _dist_name(n) not in core and _dist_name(n) not in airflow)
    assert not loose, f"dags/ or plugins/ import what no dependency or extra names: {loose}"
    celery = _extra(metadata, "celery")
    assert {"apache-airflow-providers-celery", "celery"} <= set(celery)


def test_declared_ranges_hold_the_pinned_versions(metadata):
    pins = _pins()
    for req in _requires(metadata):
        name = canonicalize_name(req.name)
        if name == "gpupool":  # an extra that includes another
            continue
        assert name in pins, f"{req.name} is declared but constraints.txt pins no version of it"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req} excludes the pinned {name}=={pins[name]} of constraints.txt")


def test_every_file_of_the_package_is_in_the_wheel(wheel):
    with zipfile.ZipFile(wheel) as zf:
        inside = set(zf.namelist())
    files = [p for p in PKG.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    expected = {p.relative_to(PKG.parent).as_posix() for p in files}
    assert any(n.startswith("gpupool/staging/migrations/versions/") for n in expected)
    missing = sorted(expected - inside)
    assert not missing, f"the wheel lacks package files (pyproject.toml's package-data or a missing __init__.py): {missing}"
