"""One home per knob: each default of the plan and the fast path is written once.

The operator's limits are one model (:class:`gpupool.config.PlanLimits`) that ``limits`` of
platforms.yaml (:class:`~gpupool.config.LimitsConfig`) and the planner's
:class:`~gpupool.decisions.policy.Policy` both are; the what-if scenario's defaults and the fast
path's :class:`~gpupool.decisions.fastpath.Settings` are read from them; the constants chosen on
benchmarks sit in one tuning object per stage (:class:`~gpupool.decisions.policy.PlanTuning`,
:class:`~gpupool.decisions.fastpath.FastPathTuning`, :class:`~gpupool.forecast.stage.ForecastTuning`).
The scan below finds every place in the package that binds one of these names to a literal (a
model field, an assignment, a dict entry, a keyword argument): there must be exactly one, its home.
"""

from __future__ import annotations

import ast
import dataclasses
from datetime import timedelta
from pathlib import Path

from gpupool.config import LimitsConfig, PlanLimits
from gpupool.decisions.fastpath import FastPathTuning, Settings
from gpupool.decisions.policy import PlanTuning, Policy
from gpupool.forecast.stage import ForecastTuning
from gpupool.sim.scenario import Scenario

PKG = Path(__file__).resolve().parents[3] / "include" / "gpupool"
#: the fast path's names for the operator's limits: read from them, never given a value of their own
DERIVED = {"max_moves_per_hour", "cooldown", "plan_max_age"}
#: knobs whose default is a named constant (its comment says why): the constant is the home
CONSTANTS = {"plan_horizon_hours": "PLAN_HORIZON_HOURS"}


def _tuning_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(cls.model_fields)


def knobs() -> set[str]:
    """Every default of the plan and the fast path (and the forecast's tuning the what-if passes in)."""
    own = {f.name for f in dataclasses.fields(Settings)} - DERIVED - {"min_nodes", "members", "backfill", "tuning",
                                                                      "ownership", "homes"}
    return (set(LimitsConfig.model_fields) | set(PlanTuning.model_fields) | _tuning_fields(FastPathTuning)
            | _tuning_fields(ForecastTuning) | own)


def _literal(node: ast.AST) -> bool:
    """A value written out: a constant, a tuple of them, ``timedelta(hours=1)``, ``Field(4, ...)``."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_literal(e) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        if name == "Field":
            default = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "default"), None)
            return default is not None and _literal(default)
        if name in ("timedelta", "Timedelta", "float", "int"):
            return all(_literal(a) for a in node.args) and all(_literal(k.value) for k in node.keywords)
    return False


def literal_bindings(root: Path, names: set[str]) -> dict[str, list[str]]:
    """``name -> ["file:line", ...]`` for every literal value given to one of ``names`` below
    ``root``: a field or variable (``name: int = 4``, ``name = Field(4)``), a dict entry
    (``{"name": 4}``) or a keyword argument (``f(name=4)``). A function's own parameter default
    (``def f(allow_evict=False)``) is the call's, not the knob's, and is not counted."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            pairs = []
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs = [(node.target.id, node.value)]
            elif isinstance(node, ast.Assign):
                pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.Dict):
                pairs = [(k.value, v) for k, v in zip(node.keys, node.values)
                         if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            elif isinstance(node, ast.Call):
                pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
            for name, value in pairs:
                if name in names and _literal(value):
                    out.setdefault(name, []).append(f"{rel}:{node.lineno}")
    return out


def test_each_default_of_the_plan_and_the_fast_path_is_written_once():
    names = knobs()
    assert {"max_moves_per_decision", "move_minutes", "cooldown_hours", "headroom", "move_cost"} <= names
    homes = {n: CONSTANTS.get(n, n) for n in names}
    found = literal_bindings(PKG, names | set(homes.values()) | DERIVED)
    wrong = {n: found.get(n, []) for n in names | DERIVED | set(homes.values())
             if len(found.get(n, [])) != (1 if n in homes.values() else 0)}
    assert wrong == {}  # each knob has exactly one literal default, at its home


def test_the_policy_and_the_configuration_are_the_same_limits():
    """Policy and LimitsConfig are PlanLimits, not copies: neither declares a limit of its own,
    and the planning job hands the configuration's limits over whole."""
    from gpupool.config import parse_config
    from gpupool.jobs.allocation import policy_from_config

    for cls in (Policy, LimitsConfig):
        assert issubclass(cls, PlanLimits)
        assert not set(cls.__dict__.get("__annotations__", {})) & set(PlanLimits.model_fields), cls
    assert issubclass(Policy, PlanTuning)
    changed = {"max_moves_per_decision": 7, "cooldown_hours": 0.5, "move_minutes": 12.0, "headroom_quantile": 0.9,
               "plan_horizon_hours": 3, "allow_evict": True}
    assert set(changed) == set(PlanLimits.model_fields)
    config = parse_config({"platforms": [{"name": "a", "kind": "simulator"}], "limits": changed})
    policy = policy_from_config(config, "reactive")
    assert {k: getattr(policy, k) for k in changed} == changed


def test_the_scenario_and_the_fast_path_read_their_defaults_from_the_limits():
    limits = LimitsConfig()
    for name in ("move_minutes", "max_moves_per_decision"):
        assert Scenario.model_fields[name].default == getattr(PlanLimits(), name)
    s = Settings()
    assert s.max_moves_per_hour == limits.max_moves_per_decision
    assert s.cooldown == timedelta(hours=limits.cooldown_hours)
    assert s.plan_max_age == timedelta(hours=limits.max_actuation_age_hours)
    assert s.tuning == FastPathTuning()


def test_the_scan_finds_a_second_home(tmp_path):
    (tmp_path / "a.py").write_text("from pydantic import Field\n\nclass A:\n    move_minutes: float = Field(30.0, ge=0)\n")
    (tmp_path / "b.py").write_text("SPEC = {'move_minutes': 30, 'step': '5min'}\n\ndef f(move_minutes=30):\n"
                                   "    return g(move_minutes=m, cooldown=timedelta(hours=1))\n")
    assert literal_bindings(tmp_path, {"move_minutes", "cooldown"}) == {
        "move_minutes": ["a.py:4", "b.py:1"], "cooldown": ["b.py:4"]}


def test_the_parking_rules_defaults_are_written_once_for_production_and_the_whatif():
    """The rule's knobs live in :class:`gpupool.decisions.parking.ParkingRule`, which production's
    ``parking:`` (``ParkingSettings``) and the what-if's (``ParkingSpec``) both are; the wake time
    is one named constant. (``trend``, ``forecast`` and ``daily`` are words other stages use too:
    the models' shared defaults are checked in tests/unit/decisions/test_parking_inputs.py.)"""
    names = {"scope", "buffer", "idle_minutes", "cooldown_minutes", "rise_quantile"}
    found = literal_bindings(PKG, names | {"wake_minutes", "WAKE_MINUTES"})
    assert {n: len(found.get(n, [])) for n in names | {"wake_minutes", "WAKE_MINUTES"}} == {
        **{n: 1 for n in names}, "wake_minutes": 0, "WAKE_MINUTES": 1}
