"""The scenario YAML: the exact format of the simulator issue, and errors naming file and key."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpupool.sim.scenario import ScenarioError, load_scenario


def hourly(values) -> np.ndarray:
    """Per-minute demand holding each of ``values`` for one hour."""
    return np.repeat(np.asarray(values, dtype=float), 60)


REPO = Path(__file__).resolve().parents[3]


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_the_issue_format_parses_with_relative_traces(tmp_path, helios):
    (tmp_path / "data").mkdir()
    for name in ("a", "b", "c", "d"):
        helios(f"data/{name}", hourly([1, 2]), total=8)
    path = _write(tmp_path, """
step: 5min            # simulation step
decision_every: 1h    # how often the allocator runs
node_gpus: 8
move_minutes: 30      # a moving node serves nobody for this long
max_moves_per_decision: 4
platforms:
  kubernetes: {trace: [data/a.csv, data/b.csv]}
  slurm: {trace: [data/c.csv]}
  openstack: {trace: [data/d.csv], nodes: 12}
""")
    sc = load_scenario(path)
    assert sc.step == dt.timedelta(minutes=5)
    assert sc.decision_every == dt.timedelta(hours=1)
    assert (sc.node_gpus, sc.move_minutes, sc.max_moves_per_decision) == (8, 30, 4)
    assert list(sc.platforms) == ["kubernetes", "slurm", "openstack"]
    assert sc.platforms["kubernetes"].trace == [(tmp_path / "data/a.csv").resolve(), (tmp_path / "data/b.csv").resolve()]
    assert sc.platforms["openstack"].nodes == 12
    assert sc.platforms["slurm"].nodes is None
    assert sc.label() == "scenario"


def test_synthetic_platforms_need_a_window(tmp_path):
    path = _write(tmp_path, "platforms:\n  slurm: {synthetic: {base: 20}}\n")
    with pytest.raises(ScenarioError, match="scenario.yaml.*start and end"):
        load_scenario(path)
    ok = _write(tmp_path, "start: 2024-01-01\nend: 2024-01-02\nplatforms:\n  slurm: {synthetic: {base: 20}}\n")
    sc = load_scenario(ok)
    assert sc.platforms["slurm"].synthetic.base == 20
    assert sc.start.tzinfo is not None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("step: 5min\n", r"platforms: missing"),
        ("platforms: [a, b]\n", r"platforms: must be a mapping"),
        ("step: fast\nplatforms:\n  s: {trace: x.csv}\n", r"step: .*not a duration"),
        ("step: 5\nplatforms:\n  s: {trace: x.csv}\n", r"step: .*unit"),
        ("node_gpus: 0\nplatforms:\n  s: {trace: x.csv}\n", r"node_gpus"),
        ("colour: red\nplatforms:\n  s: {trace: x.csv}\n", r"colour: Extra inputs"),
        ("platforms:\n  s: {nodes: 3}\n", r"platforms\.s: .*exactly one of 'trace' or 'synthetic'"),
        ("platforms:\n  s: {trace: missing.csv}\n", r"platforms\.s\.trace\.0: no such file"),
        ("platforms:\n  s: {synthetic: {bse: 3}}\nstart: 2024-01-01\nend: 2024-01-02\n",
         r"platforms\.s\.synthetic\.bse"),
        ("decision_every: 7min\nplatforms:\n  s: {trace: x.csv}\n", r"whole multiple of step"),
        ("platforms: {s: {trace: [x.csv}\n", r"not valid YAML"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(ScenarioError, match=match) as err:
        load_scenario(path)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "none.yaml")


def test_the_shipped_helios_scenario_loads():
    sc = load_scenario(REPO / "config/scenarios/helios-3platforms.yaml")
    assert set(sc.platforms) == {"kubernetes", "slurm", "openstack"}
    assert all(len(p.trace) == 2 and all(t.is_file() for t in p.trace) for p in sc.platforms.values())
    # the traces ship with the repository: nothing outside it is read
    assert all(t.is_relative_to(REPO.resolve()) for p in sc.platforms.values() for t in p.trace)


def test_the_shipped_helios_traces_are_the_month_the_readme_reports():
    from gpupool.sim.traces import read_helios

    sc = load_scenario(REPO / "config/scenarios/helios-3platforms.yaml")
    frames = {name: read_helios(p.trace, step="5min") for name, p in sc.platforms.items()}
    for frame in frames.values():
        assert len(frame) == 31 * 288
        assert frame.index[0] == pd.Timestamp("2020-05-01", tz="UTC")
        assert frame.index[-1] == pd.Timestamp("2020-05-31 23:55", tz="UTC")
        assert (frame["demand"] >= 0).all() and frame["util"].between(0, 1).all()
    # GPU-hours of demand in the month's what-if table (docs/benchmarks/simulate.md: 310,327), and 61 8-GPU nodes
    gpu_hours = sum(f["demand"].sum() for f in frames.values()) * 5 / 60
    assert round(gpu_hours) == 310327
    from gpupool.sim.world import World

    assert len(World(sc).nodes) == 61


def test_the_shipped_demo_scenario_matches_the_default_world():
    from gpupool.sim.world import World, default_world

    sc = load_scenario(REPO / "config/scenarios/demo-world.yaml")
    world = World(sc)
    demo = default_world("2024-01-01", "2024-01-15")
    assert world.platforms == demo.platforms
    assert np.array_equal(world.demand_, demo.demand_)
    assert [n.name for n in world.nodes] == [n.name for n in demo.nodes]


def test_the_demo_world_has_a_platform_queueing_while_another_idles():
    """What default_world's docstring says of it: the platforms peak at different hours (office
    hours, night, late afternoon), and on a static split one of them often queues while another
    holds a whole idle node."""
    from gpupool.sim.world import default_world

    w = default_world("2024-01-01", "2024-01-15")
    demand = pd.DataFrame({p: w.demand(p, w.start, w.end).to_numpy() for p in w.platforms},
                          index=w.index)
    by_hour = demand.groupby(demand.index.hour).mean()
    assert 11 <= by_hour["openstack"].idxmax() <= 15
    assert by_hour["slurm"].idxmax() <= 5
    assert 14 <= by_hour["kubernetes"].idxmax() <= 18
    capacity = pd.Series({p: len(w.inventory(p)) * w.scenario.node_gpus for p in w.platforms})
    queues = demand.gt(capacity, axis=1)
    idle_node = demand.le(capacity - w.scenario.node_gpus, axis=1)
    both = pd.Series([any(queues.iloc[i][p] and idle_node.iloc[i].drop(p).any() for p in w.platforms)
                      for i in range(len(demand))], index=demand.index)
    assert both.mean() > 0.05
    assert demand.sum(axis=1).le(capacity.sum()).mean() > 0.95  # the pool as a whole has room
