"""The house's layering rules (the README's *Layout*), checked on one import graph that follows
imports through modules.

Data flows one way: platform APIs -> sources -> staging -> detect -> forecast -> decisions ->
actuation -> jobs. Every import counts, also those inside functions (a lazy import is still a
dependency), and a rule holds for everything a module reaches, not only what it names: a stage
that imports a shared module which imports a later stage breaks the rule as surely as a direct
import.

One rule per package of the allocation: ``decisions`` is pure (it reaches no stage, nor
actuation or the jobs: numbers in, decisions out); ``actuation`` never reaches the jobs that
drive it, the what-if or the detect and forecast stages; ``jobs`` may reach every stage, the
decisions and actuation, and nothing built on top of it. The what-if reaches the pure decisions
only (its own actuator the actuators' interface and marks), the platform-API emulator only the
marks; and no module reaches itself (no circle of imports).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[3] / "include" / "gpupool"
STAGES = ["sources", "staging", "detect", "forecast", "decisions", "actuation", "jobs"]
#: what each package may not reach beyond a later stage, the layers above and the simulator
NEVER = {
    # pure: reads nothing and acts on nothing, so it reaches no other stage at all
    "decisions": set(STAGES) - {"decisions"},
    # acts on what the jobs decided: it neither judges telemetry nor forecasts (the platforms'
    # API clients it shares with the sources are fair)
    "actuation": {"detect", "forecast"},
}
#: built on top of the stages: no stage may reach them
ABOVE = {"pipeline", "cli", "collector", "poolview", "report", "airflow_glue", "platforms", "summary", "metrics", "notify",
         "config_doc"}
#: the what-if and the platform-API emulator: the stages never know a platform is simulated
SIMULATOR = {"sim", "emulator"}
#: of actuation, what the what-if's own actuator may reach (the interface and the marks), and
#: what the emulator may (the marks gpupool leaves on a platform, which it plays back)
SIM_ACTUATOR = "sim.actuator"
SIM_ACTUATION = {"actuation", "actuation.actuators", "actuation.actuators.base", "actuation.marks"}
EMULATOR_ACTUATION = {"actuation", "actuation.marks"}
#: modules every layer may use; they import nothing from gpupool
LEAVES = {"errors", "values", "k8s_keys", "actuation.marks", "decisions.cadence"}
#: the edges the rules allow against the flow, and why: loading platforms.yaml checks its
#: ``detect.router`` section against the detect stage's settings models (``detect.settings``, a
#: leaf that imports nothing of the package, inside a validator: a stage that reads its config
#: loads no detector)
#: and, the same way, its ``parking`` section against the parking rule's knobs
#: (``decisions.parking``, which imports nothing of the package), whose defaults the what-if shares
ALLOWED_EDGES = {("config", "detect.settings"), ("config", "decisions.parking")}
#: what a fitted model must never be read back through
UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split(".")) if name else root
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def scan(path: Path, root: Path) -> tuple[set[str], set[str]]:
    """``(internal, external)``: the gpupool modules (names below ``gpupool``, resolved to
    modules; importing a name from a module is an edge to that module) and the top-level
    outside packages one file imports, wherever in the file the import stands."""
    internal, external = set(), set()
    here = _module_name(path, root).split(".") if path.name != "__init__.py" or path.parent != root else []
    package = here if path.name == "__init__.py" else here[:-1]
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "gpupool" or a.name.startswith("gpupool."):
                    internal.add(a.name[len("gpupool."):] if a.name != "gpupool" else "")
                else:
                    external.add(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module == "gpupool" or (node.module or "").startswith("gpupool."):
                module = node.module[len("gpupool."):] if node.module != "gpupool" else ""
            else:
                external.add((node.module or "").split(".")[0])
                continue
            for a in node.names:
                sub = f"{module}.{a.name}" if module else a.name
                internal.add(sub if _is_module(sub, root) else module)
    # importing a.b.c runs a/__init__ and a/b/__init__ first
    closed = set()
    for name in internal:
        parts = name.split(".") if name else []
        closed |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in closed if m and _is_module(m, root)}, external


@lru_cache(maxsize=None)
def graph(root: Path = PKG) -> dict[str, tuple[frozenset, frozenset]]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = _module_name(path, root)
        internal, external = scan(path, root)
        allowed = {dst for src, dst in ALLOWED_EDGES if src == name}
        internal = {m for m in internal if m not in allowed}
        # a package is reached through an allowed edge alone when nothing else of it is imported
        internal = {m for m in internal if not (any(a.startswith(m + ".") for a in allowed)
                                                and not any(k.startswith(m + ".") for k in internal))}
        out[name] = (frozenset(internal - {name}), frozenset(external))
    return out


def reach(name: str, g: dict) -> set[str]:
    """Every gpupool module ``name`` reaches through imports, itself excluded."""
    seen, todo = set(), [name]
    while todo:
        for dep in g.get(todo.pop(), (frozenset(), frozenset()))[0]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    seen.discard(name)
    return seen


def _top(name: str) -> str:
    return name.split(".")[0]


def _path_to(start: str, bad: set[str], g: dict) -> list[str]:
    """One import chain from ``start`` to a module under ``bad`` (for a readable failure)."""
    prev, todo = {start: None}, [start]
    while todo:
        cur = todo.pop(0)
        if cur != start and _top(cur) in bad:
            chain = [cur]
            while prev[chain[-1]] is not None:
                chain.append(prev[chain[-1]])
            return chain[::-1]
        for dep in sorted(g.get(cur, (frozenset(),))[0]):
            if dep not in prev:
                prev[dep] = cur
                todo.append(dep)
    return []


def _violations(modules, forbidden_of, g) -> list[str]:
    bad = []
    for mod in modules:
        forbidden = forbidden_of(mod)
        if {_top(m) for m in reach(mod, g)} & forbidden:
            bad.append(" -> ".join(_path_to(mod, forbidden, g)))
    return bad


def stage_violations(g: dict) -> list[str]:
    """Import chains by which a stage reaches a later stage, a layer above, the simulator, or
    what its package's own rule (:data:`NEVER`) forbids."""

    def forbidden(mod):
        top = _top(mod)
        i = STAGES.index(top)
        return set(STAGES[i + 1:]) | ABOVE | SIMULATOR | NEVER.get(top, set())

    return _violations([m for m in g if _top(m) in STAGES], forbidden, g)


def whatif_violations(g: dict) -> list[str]:
    """Modules of the what-if and the emulator that reach more of the allocation than theirs:
    the what-if the pure decisions (its actuator also the actuators' interface and marks), the
    emulator the marks alone."""
    bad = []
    for mod in sorted(m for m in g if _top(m) in SIMULATOR):
        reached = reach(mod, g)
        # a module that builds the what-if's actuator reaches what the actuator may
        allowed = (SIM_ACTUATION if mod == SIM_ACTUATOR or SIM_ACTUATOR in reached
                   else EMULATOR_ACTUATION if _top(mod) == "emulator" else set())
        extra = sorted(m for m in reached if (_top(m) == "actuation" and m not in allowed) or _top(m) == "jobs")
        if extra:
            bad.append(f"{mod} reaches {', '.join(extra)}")
    return bad


def circles(g: dict) -> list[list[str]]:
    """Every circle of imports (strongly connected modules), each sorted. An edge from a module
    to a package it lies in is not one: the package is initialised before its module runs."""
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, (deps, _) in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_stage_reaches_a_later_stage_the_layers_above_or_the_simulator():
    assert stage_violations(graph()) == []


def test_the_decisions_are_pure():
    """decisions reaches nothing of staging, sources, detect, forecast, actuation or the jobs
    (and, by the package-wide rule below, no Airflow)."""
    g = graph()
    decisions = [m for m in g if _top(m) == "decisions"]
    assert {"decisions.planner", "decisions.fastpath", "decisions.demand", "decisions.policy"} <= set(decisions)
    assert _violations(decisions, lambda m: set(STAGES) - {"decisions"} | ABOVE | SIMULATOR, g) == []


def test_the_whatif_reaches_the_pure_decisions_only():
    g = graph()
    assert whatif_violations(g) == []
    assert {"decisions.planner", "decisions.fastpath", "decisions.demand"} <= reach("sim.study", g)


def test_no_circle_of_imports():
    assert circles(graph()) == []


def test_staging_knows_no_stage():
    g = graph()
    others = set(STAGES) - {"staging"} | ABOVE | SIMULATOR
    assert _violations([m for m in g if _top(m) == "staging"], lambda m: others, g) == []


def test_shared_modules_reach_no_stage_above_what_they_serve():
    """config, canonical, tsio, mig, hostname are read by every stage: they reach no stage
    (a stage reading its config must not thereby import the planner)."""
    g = graph()
    shared = [m for m in g if _top(m) in {"config", "canonical", "tsio", "mig", "hostname", "window"}]
    assert len(shared) == 6
    assert _violations(shared, lambda m: set(STAGES) | ABOVE | SIMULATOR, g) == []


def test_leaves_import_nothing_from_the_package():
    g = graph()
    assert {m: sorted(g[m][0]) for m in LEAVES if g[m][0]} == {}


def test_the_package_imports_neither_airflow_nor_the_dags():
    """Only dags/ and plugins/ import Airflow (airflow_glue, their adapter, takes Airflow's
    objects as arguments); the package never imports from dags/."""
    g = graph()
    assert {m: sorted(ext & {"airflow", "dags"}) for m, (_, ext) in g.items() if ext & {"airflow", "dags"}} == {}


def test_the_package_never_imports_an_unpickler():
    g = graph()
    assert {m: sorted(ext & UNPICKLERS) for m, (_, ext) in g.items() if ext & UNPICKLERS} == {}


def test_the_config_edge_into_detect_reaches_a_leaf_only():
    """The edge ``config`` is allowed into ``detect`` loads the settings models and nothing else."""
    g = graph()
    assert reach("detect.settings", g) <= {"detect"}
    assert g["detect"][0] == frozenset()


def test_no_import_cycle_in_detect():
    """The detect stage's modules import one another in one direction: settings, then the rules
    and detectors, the fitted model, the stream (every import counts, also under TYPE_CHECKING
    and inside functions)."""
    g = graph()
    detect = {m for m in g if _top(m) == "detect"}
    assert len(detect) > 15
    assert [c for c in circles(g) if set(c) & detect] == []


def test_the_planning_job_reads_staging_through_reads_and_stores_only():
    g = graph()
    deps = g["jobs.allocation"][0]
    assert "pipeline" not in {_top(m) for m in reach("jobs.allocation", g)}
    assert "staging.reads" in deps


# --- the scanner itself ------------------------------------------------------------------------


@pytest.fixture
def fake_pkg(tmp_path):
    root = tmp_path / "gpupool"
    for rel, text in {
        "__init__.py": "",
        "errors.py": "",
        "config.py": "def f():\n    from gpupool.decisions import policy\n",
        "detect/__init__.py": "",
        "detect/router.py": "from . import features\nfrom ..config import f\n",
        "detect/features.py": "import numpy\n",
        "decisions/__init__.py": "",
        "decisions/policy.py": "import pickle\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_cycle_finder_finds_a_circle_through_a_type_checking_import(tmp_path):
    root = tmp_path / "gpupool"
    for rel, text in {
        "__init__.py": "",
        "detect/__init__.py": "",
        "detect/model.py": "from gpupool.detect.rules import stuck\n",
        "detect/rules/__init__.py": "",
        "detect/rules/stuck.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpupool.detect.model import M\n",
        "detect/leaf.py": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    g = graph(root)
    assert circles(g) == [["detect.model", "detect.rules.stuck"]]


def test_the_scanner_follows_relative_lazy_and_transitive_imports(fake_pkg):
    g = graph(fake_pkg)
    assert g["detect.router"][0] == {"detect", "detect.features", "config"}
    assert g["config"][0] == {"decisions", "decisions.policy"}
    # detect reaches decisions only through config, inside a function: still a violation
    assert "decisions.policy" in reach("detect.router", g)
    assert _path_to("detect.router", {"decisions"}, g) == ["detect.router", "config", "decisions"]
    assert g["decisions.policy"][1] == {"pickle"}
    assert g["detect.features"][1] == {"numpy"}


def test_inputfiles_reaches_nothing_but_errors():
    """Every layer opens its inputs through gpupool.inputfiles: it must stay a leaf but for the
    error classes."""
    g = graph()
    assert reach("inputfiles", g) == {"errors"}


def _fake(tmp_path, files: dict[str, str]) -> dict:
    root = tmp_path / "gpupool"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return graph(root)


def test_each_package_rule_catches_what_it_forbids(tmp_path):
    g = _fake(tmp_path, {
        "staging/__init__.py": "", "staging/reads.py": "",
        "decisions/__init__.py": "", "decisions/planner.py": "def f():\n    from gpupool.staging import reads\n",
        "actuation/__init__.py": "", "actuation/marks.py": "",
        "actuation/actuators/__init__.py": "", "actuation/actuators/base.py": "from gpupool.actuation import marks\n",
        "actuation/handover.py": "from gpupool.jobs import allocation\n",
        "jobs/__init__.py": "", "jobs/allocation.py": "from gpupool.decisions import planner\n",
        "sim/__init__.py": "", "sim/study.py": "from gpupool.actuation import handover\n",
        "sim/actuator.py": "from gpupool.actuation.actuators.base import marks\n",
        "emulator/__init__.py": "", "emulator/placement.py": "from gpupool.actuation.actuators import base\n",
    })
    assert sorted(stage_violations(g)) == ["actuation.handover -> jobs", "decisions.planner -> staging"]
    assert whatif_violations(g) == ["emulator.placement reaches actuation.actuators, actuation.actuators.base",
                                    "sim.study reaches actuation, actuation.handover, jobs, jobs.allocation"]


def test_a_circle_of_imports_is_found_and_a_package_init_is_none(tmp_path):
    g = _fake(tmp_path, {
        "forecast/__init__.py": "from gpupool.forecast.arima import A\n",
        "forecast/arima.py": "from gpupool.forecast import _arma\nA = 1\n", "forecast/_arma.py": "",
        "detect/__init__.py": "", "detect/model.py": "def f():\n    from gpupool.detect import rules\n",
        "detect/rules.py": "from gpupool.detect.model import f\n",
    })
    assert circles(g) == [["detect.model", "detect.rules"]]
