"""Hostile but fair input: every case is exit 2 with one line on stderr naming what and where,
no traceback, inputs untouched and no output left behind (not even half of one)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from gpupool.cli import main

UNREACHABLE = "postgresql+psycopg://gpupool:Sup3rS3cretFAKE@127.0.0.1:1/staging"


# --- helpers ---------------------------------------------------------------------------------


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as done:  # argparse's own errors
        rc = done.code
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str, *needles: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("gpupool")
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under folder (hidden ones included) with its content hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    } | {str(p.relative_to(folder)): "link->" + os.readlink(p) for p in folder.rglob("*") if p.is_symlink()}


def _refused(capsys, folder: Path, *argv: str, needles: tuple[str, ...] = ()) -> str:
    before = _snapshot(folder)
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2, (rc, out, err)
    line = _one_line(err, *needles)
    assert _snapshot(folder) == before  # inputs untouched, nothing written, no temporary left
    return line


def _series(n: int = 200, seed: int = 0) -> tuple[pd.DatetimeIndex, np.ndarray]:
    ts = pd.date_range("2026-01-01", periods=n, freq="h", tz="UTC")
    rng = np.random.default_rng(seed)
    return ts, 10 + 3 * np.sin(np.arange(n) / 24 * 2 * np.pi) + rng.normal(0, 0.2, n)


def _write(path: Path, ts, values) -> Path:
    pd.DataFrame({"ts": [t.strftime("%Y-%m-%dT%H:%M:%S") if not isinstance(t, str) else t for t in ts], "v": values}).to_csv(
        path, index=False
    )
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    ts, v = _series()
    _write(folder / "good.csv", ts, v)
    return folder


@pytest.fixture
def staging(tmp_path, monkeypatch) -> str:
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_GPUPOOL_STAGING", raising=False)
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    return url


# --- CSV input of detect and forecast --------------------------------------------------------


def test_detect_on_binary_garbage(capsys, data):
    (data / "garbage.csv").write_bytes(np.random.default_rng(1).bytes(3000))
    _refused(capsys, data, "detect", str(data / "garbage.csv"), "--out", str(data / "out.csv"),
             needles=("garbage.csv", "UTF-8"))
    (data / "table.csv").write_bytes(bytes(range(256)) * 12)
    _refused(capsys, data, "detect", str(data / "table.csv"), "--out", str(data / "out.csv"),
             needles=("table.csv", "cannot read CSV"))


def test_detect_on_values_beyond_double_range(capsys, data):
    ts, _ = _series()
    _write(data / "huge.csv", ts, [1e308 if i % 2 == 0 else -1e308 for i in range(len(ts))])
    _refused(capsys, data, "detect", str(data / "huge.csv"), "--out", str(data / "out.csv"),
             needles=("huge.csv", "line 2", "'v'", "1e+308"))


def test_forecast_on_an_all_inf_column(capsys, data):
    ts, _ = _series()
    _write(data / "inf.csv", ts, [np.inf] * len(ts))
    _refused(capsys, data, "forecast", str(data / "inf.csv"), "--horizon", "3", "--out", str(data / "out.csv"),
             needles=("inf.csv", "line 2", "'v'", "not finite"))


def test_forecast_into_a_missing_directory(capsys, data):
    _refused(capsys, data, "forecast", str(data / "good.csv"), "--horizon", "3", "--out", str(data / "nope" / "out.csv"),
             needles=("--out", "nope", "does not exist"))


def test_detect_into_a_missing_directory(capsys, data):
    _refused(capsys, data, "detect", str(data / "good.csv"), "--out", str(data / "nope" / "out.csv"),
             needles=("--out", "nope", "does not exist"))


@pytest.mark.parametrize(
    "option, value, needle",
    [
        ("--horizon", "-5", "--horizon -5"),
        ("--horizon", "0", "--horizon 0"),
        ("--horizon", "1000000000", "8784"),  # a documented maximum: 24 x 366 steps
        ("--horizon", "1e9", "--horizon"),  # not an integer: argparse, on one line too
        ("--level", "150", "--level"),
        ("--level", "0", "--level"),
        ("--level", "nan", "--level"),
        ("--level", "1e-300", "from 1 to 99.9"),  # was a ZeroDivisionError traceback
        ("--level", "0.5", "from 1 to 99.9"),
        ("--level", "99.95", "from 1 to 99.9"),
    ],
)
def test_forecast_option_out_of_range(capsys, data, option, value, needle):
    args = {"--horizon": "3", "--level": "90", option: value}
    _refused(capsys, data, "forecast", str(data / "good.csv"), "--out", str(data / "out.csv"),
             "--horizon", args["--horizon"], "--level", args["--level"], needles=(needle,))


def test_the_maximum_horizon_itself_is_accepted(capsys, data):
    from gpupool.forecast.io import MAX_HORIZON

    assert MAX_HORIZON == 24 * 366
    rc, _, err = _cli(capsys, "forecast", str(data / "good.csv"), "--horizon", str(MAX_HORIZON), "--out", str(data / "out.csv"))
    assert rc == 0, err
    assert len(pd.read_csv(data / "out.csv")) == MAX_HORIZON


@pytest.mark.parametrize("command", ["forecast", "detect"])
@pytest.mark.parametrize("how", ["same", "relative", "symlink", "hardlink"])
def test_output_that_is_the_input_is_refused(capsys, data, monkeypatch, command, how):
    src = data / "good.csv"
    if how == "same":
        out = str(src)
    elif how == "relative":
        (data / "sub").mkdir()
        monkeypatch.chdir(data / "sub")
        out = "../good.csv"
    elif how == "symlink":
        (data / "link.csv").symlink_to(src)
        out = str(data / "link.csv")
    else:
        os.link(src, data / "twin.csv")
        out = str(data / "twin.csv")
    extra = ["--horizon", "3"] if command == "forecast" else []
    _refused(capsys, data, command, str(src), "--out", out, *extra, needles=("--out", "input"))


def test_summary_json_that_is_the_input_is_refused(capsys, data):
    src = data / "good.csv"
    _refused(capsys, data, "forecast", str(src), "--horizon", "3", "--out", str(data / "out.csv"),
             "--summary-json", str(src), needles=("--summary-json", "input"))


def test_a_failed_write_leaves_no_half_written_output(capsys, data, monkeypatch):
    """The output is written beside and moved into place: a failure mid-write leaves the old file."""
    (data / "out.csv").write_text("previous,content\n")
    before = _snapshot(data)

    def broken(self, path, *a, **k):
        Path(path).write_text("step,timestamp\n1,")  # half a file, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", broken)
    rc, _, err = _cli(capsys, "forecast", str(data / "good.csv"), "--horizon", "3", "--out", str(data / "out.csv"))
    assert rc == 2
    _one_line(err, "cannot write", "out.csv", "No space left on device")  # the disk's error, not a traceback
    assert _snapshot(data) == before


def test_duplicate_timestamps_are_refused_naming_the_repeat(capsys, data):
    """Which of two values at one timestamp is genuine cannot be known: refuse, replace nothing."""
    ts, v = _series()
    ts = list(ts[:100]) + [ts[99]] + list(ts[100:])
    v = list(v[:100]) + [500.0] + list(v[100:])  # a second, wild value for the 100th timestamp
    _write(data / "dup.csv", ts, v)
    line = _refused(capsys, data, "detect", str(data / "dup.csv"), "--out", str(data / "out.csv"),
                    needles=("dup.csv", "line 102", "repeats line 101"))
    assert "2026-01-05T03:00:00" in line
    _refused(capsys, data, "forecast", str(data / "dup.csv"), "--horizon", "3", "--out", str(data / "out.csv"),
             needles=("line 102",))


def test_mixed_utc_offsets_are_read_as_utc(capsys, data):
    ts, v = _series()
    mixed = [(t.tz_convert("Europe/Paris") if i % 2 else t).isoformat() for i, t in enumerate(ts)]
    assert {m[-6:] for m in mixed} == {"+00:00", "+01:00"}
    _write(data / "mixed.csv", mixed, v)
    rc, _, err = _cli(capsys, "detect", str(data / "mixed.csv"), "--out", str(data / "out.csv"))
    assert rc == 0, err
    table = pd.read_csv(data / "out.csv")
    assert len(table) == len(ts)
    assert pd.DatetimeIndex(pd.to_datetime(table["timestamp"], utc=True)).equals(pd.DatetimeIndex(ts))
    assert np.allclose(table["value"], v)



@pytest.mark.parametrize("zone, offset", [("Europe/Paris", "+01:00"), ("America/New_York", "-05:00")])
def test_a_utc_offset_is_kept_by_forecast_as_by_detect(capsys, data, zone, offset):
    """Times that all carry one offset got forecast timestamps without it (an hour off as UTC)."""
    ts, v = _series()
    local = [t.tz_convert(zone).isoformat() for t in ts]
    assert {t[-6:] for t in local} == {offset}
    _write(data / "local.csv", local, v)
    rc, _, err = _cli(capsys, "forecast", str(data / "local.csv"), "--horizon", "3", "--out", str(data / "fc.csv"))
    assert rc == 0, err
    stamps = pd.read_csv(data / "fc.csv")["timestamp"]
    assert all(s.endswith(offset) for s in stamps), list(stamps)
    step = pd.Timedelta(hours=1)
    assert list(pd.to_datetime(stamps, utc=True)) == [ts[-1] + k * step for k in (1, 2, 3)]
    rc, _, err = _cli(capsys, "detect", str(data / "local.csv"), "--out", str(data / "det.csv"))
    assert rc == 0, err
    assert pd.read_csv(data / "det.csv")["timestamp"].iloc[-1] == local[-1]  # the same form in both modes


def test_mixed_offsets_forecast_in_utc_and_naive_times_stay_naive(capsys, data):
    ts, v = _series()
    mixed = [(t.tz_convert("Europe/Paris") if i % 2 else t).isoformat() for i, t in enumerate(ts)]
    _write(data / "mixed.csv", mixed, v)
    rc, _, err = _cli(capsys, "forecast", str(data / "mixed.csv"), "--horizon", "2", "--out", str(data / "fc.csv"))
    assert rc == 0, err
    assert list(pd.read_csv(data / "fc.csv")["timestamp"]) == [
        (ts[-1] + pd.Timedelta(hours=k)).strftime("%Y-%m-%dT%H:%M:%S+00:00") for k in (1, 2)]
    rc, _, err = _cli(capsys, "forecast", str(data / "good.csv"), "--horizon", "2", "--out", str(data / "fc2.csv"))
    assert rc == 0, err
    assert list(pd.read_csv(data / "fc2.csv")["timestamp"]) == [
        (ts[-1] + pd.Timedelta(hours=k)).strftime("%Y-%m-%dT%H:%M:%S") for k in (1, 2)]


# --- configuration and scenarios -------------------------------------------------------------


def _config(folder: Path, text: str) -> Path:
    path = folder / "platforms.yaml"
    path.write_text(text)
    return path


WINDOW = ("--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z")


@pytest.mark.parametrize(
    "text, needles",
    [
        ("platforms:\n  - {name: hpc, kind: slurm}\n", ("platforms[hpc]", "conn_id")),
        ("platforms:\n  - {name: cloud, kind: openstack, min_nodes: 1}\n", ("platforms[cloud]", "conn_id")),
        ("platforms:\n  - {name: a, kind: simulator}\ndetect:\n  router: {tau_multipler: 5}\n",
         ("detect.router", "'tau_multipler'")),
        ('platforms:\n  - {name: a, kind: simulator}\ndry_run: "off"\n', ("dry_run", "'off'")),
        ("platforms:\n  - {name: a, kind: simulator}\ndry_run: 0\n", ("dry_run",)),
        ('platforms:\n  - {name: a, kind: simulator, actuation: "yes"}\n', ("platforms[a].actuation", "'yes'")),
        ('platforms:\n  - {name: a, kind: simulator}\nlimits: {allow_evict: "true"}\n', ("limits.allow_evict",)),
    ],
)
def test_bad_config_is_one_line_naming_file_and_key(capsys, data, staging, text, needles):
    path = _config(data, text)
    line = _refused(capsys, data, "summary", "--config", str(path), *WINDOW, needles=needles)
    assert "platforms.yaml" in line



POOL_PLATFORMS = "platforms:\n  - {name: slurm, kind: simulator}\n  - {name: kubernetes, kind: simulator}\n"


@pytest.mark.parametrize("nodes", [
    "    - {node: gpu-n001, gpus: 8}\n    - {node: gpu-n002, gpus: 8, names: {slurm: gpu-n001}}\n",
    "    - {node: gpu-n002, gpus: 8, names: {slurm: gpu-n001}}\n    - {node: gpu-n001, gpus: 8}\n",
])
def test_an_alias_that_is_another_nodes_implicit_name_is_refused(capsys, data, staging, nodes):
    """Both machines mapped to one pool id on slurm: the sources would merge them into one node."""
    path = _config(data, POOL_PLATFORMS + "pool:\n  nodes:\n" + nodes)
    _refused(capsys, data, "summary", "--config", str(path), *WINDOW,
             needles=("platforms.yaml", "'pool'", "'slurm'", "'gpu-n001'", "gpu-n002", "two pool nodes"))


def test_a_names_key_that_is_no_platform_is_refused(capsys, data, staging):
    path = _config(data, POOL_PLATFORMS + "pool:\n  nodes:\n    - {node: gpu-n001, gpus: 8, names: {slrum: a01}}\n")
    _refused(capsys, data, "summary", "--config", str(path), *WINDOW,
             needles=("platforms.yaml", "nodes[gpu-n001].names", "'slrum'", "slurm, kubernetes"))


def test_swapped_aliases_and_many_pool_nodes_are_accepted(data):
    from gpupool.config import parse_config

    cfg = parse_config({"platforms": [{"name": "slurm", "kind": "simulator"}], "pool": {"nodes": [
        {"node": "a", "gpus": 8, "names": {"slurm": "b"}}, {"node": "b", "gpus": 8, "names": {"slurm": "a"}}]}})
    assert cfg.pool.node_id("slurm", "b") == "a" and cfg.pool.node_id("slurm", "a") == "b"
    many = [{"node": f"n{i:05d}", "gpus": 8, "names": {"slurm": f"s{i:05d}"}} for i in range(20_000)]
    assert len(parse_config({"platforms": [{"name": "slurm", "kind": "simulator"}], "pool": {"nodes": many}}).pool.nodes) == 20_000


def test_real_yaml_booleans_still_work(data):
    from gpupool.config import load_config

    cfg = load_config(_config(data, "platforms:\n  - {name: a, kind: simulator, actuation: yes}\ndry_run: off\n"))
    assert cfg.dry_run is False and cfg.platforms[0].actuation is True


def test_unknown_key_under_a_scenario_policy(capsys, data):
    scenario = Path(__file__).resolve().parents[3] / "config" / "scenarios" / "synthetic-3platforms.yaml"
    text = scenario.read_text().replace("seed: 0\n", "seed: 0\npolicy: {move_cots: 2}\n")
    assert "move_cots" in text
    (data / "scenario.yaml").write_text(text)
    _refused(capsys, data, "simulate", str(data / "scenario.yaml"), "--no-progress",
             needles=("scenario.yaml", "policy", "'move_cots'"))



def _two_platform_scenario(folder: Path, move_minutes: float, slurm: str = "synthetic: {base: 5, total_gpus: 64}") -> Path:
    path = folder / "scenario.yaml"
    path.write_text(
        f"step: 5min\ndecision_every: 1h\nnode_gpus: 8\nmove_minutes: {move_minutes}\n"
        "start: 2024-01-01T00:00:00Z\nend: 2024-01-03T00:00:00Z\nplatforms:\n"
        f"  slurm: {{nodes: 8, {slurm}}}\n  kubernetes: {{nodes: 2, synthetic: {{base: 60, total_gpus: 16}}}}\n")
    return path


@pytest.mark.parametrize("minutes", ["2880", "100000"])
def test_a_move_that_outlasts_the_window_is_named(capsys, data, minutes):
    """Was `node 'gpu-n002': no 'owner' (or 'platform')` from the planner, an hour into the run."""
    path = _two_platform_scenario(data, float(minutes))
    _refused(capsys, data, "simulate", str(path), "--no-progress", "--policy", "reactive",
             needles=("scenario.yaml", "move_minutes", minutes, "outlasts", "2880 minutes"))


def test_a_late_move_that_arrives_after_the_end_keeps_its_target():
    """A move shorter than the window but made near its end is still bound for its target."""
    from gpupool.decisions.layouts import node_records
    from gpupool.sim.scenario import scenario_from_dict
    from gpupool.sim.world import World

    scenario = scenario_from_dict({
        "move_minutes": 600, "start": "2024-01-01T00:00Z", "end": "2024-01-03T00:00Z",
        "platforms": {"slurm": {"nodes": 2, "synthetic": {"base": 5, "total_gpus": 16}},
                      "kubernetes": {"nodes": 1, "synthetic": {"base": 5, "total_gpus": 8}}}})
    world = World(scenario, clock="start")
    world.advance(world.start + pd.Timedelta(hours=40))
    assert world.move("gpu-n001", "kubernetes") > world.end
    world.advance(world.start + pd.Timedelta(hours=41))
    moving = next(n for n in world.pool() if n["name"] == "gpu-n001")
    assert moving["platform"] == "kubernetes" and moving["in_transit"] and moving["available_in_minutes"] == 420
    assert {r.name: r.owner for r in node_records(world.pool())}["gpu-n001"] == "kubernetes"


def _helios(path: Path, running: list[float], pending: list[float] | None = None) -> Path:
    ts = pd.date_range("2024-01-01", periods=len(running), freq="5min", tz="UTC")
    pd.DataFrame({"time": ts.strftime("%Y-%m-%d %H:%M:%S"), "running_gpu_num": running,
                  "pending_gpu_num": pending or [0.0] * len(running), "total_gpu_num": 32.0}).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("column, value, needle", [
    ("running", -30.0, "negative"),
    ("pending", float("inf"), "not finite"),
    ("running", float("-inf"), "not finite"),
])
def test_a_bad_trace_value_names_file_line_and_column(capsys, data, column, value, needle):
    """Negative values were blamed on a node (`busy_gpus -30.0 outside 0..8`); an `inf` was
    simulated and written into the result as `Infinity`."""
    running, pending = [10.0] * 288, [0.0] * 288
    (running if column == "running" else pending)[99] = value
    _helios(data / "bad.csv", running, pending)
    _helios(data / "ok.csv", [10.0] * 288)
    (data / "trace.yaml").write_text("move_minutes: 30\nplatforms:\n  slurm: {trace: [bad.csv]}\n"
                                     "  kubernetes: {trace: [ok.csv]}\n")
    _refused(capsys, data, "simulate", str(data / "trace.yaml"), "--no-progress", "--policy", "reactive",
             "--json", str(data / "out.json"),
             needles=("bad.csv", "line 101", f"'{column}_gpu_num'", needle))


def _strict(text: str):
    import json

    def refuse(token):
        raise AssertionError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_every_json_the_cli_writes_is_strict(capsys, data, monkeypatch):
    """No `NaN` or `Infinity` leaves the CLI: a non-finite number is written as null."""
    import gpupool.detect.io as detect_io
    import gpupool.sim.scenario as sim_scenario
    import gpupool.sim.study as sim_study

    monkeypatch.setattr(detect_io, "detect_csv", lambda *a, **k: {"rows": 3, "score": float("nan")})
    rc, out, err = _cli(capsys, "detect", str(data / "good.csv"), "--out", str(data / "out.csv"))
    assert rc == 0, err
    assert _strict(out) == {"rows": 3, "score": None}

    monkeypatch.setattr(sim_scenario, "load_scenario", lambda path: SimpleNamespace(platforms={}))
    monkeypatch.setattr(sim_study, "simulate", lambda *a, **k: {
        "totals": {"unmet_gpu_hours": float("inf"), "utilization": np.float32("nan"), "moves": 2},
        "series": [1.5, float("-inf")]})
    rc, out, err = _cli(capsys, "simulate", "any.yaml", "--no-progress", "--json", str(data / "result.json"))
    assert rc == 0, err
    expected = {"totals": {"unmet_gpu_hours": None, "utilization": None, "moves": 2}, "series": [1.5, None]}
    assert _strict(out) == expected
    assert _strict((data / "result.json").read_text()) == expected


def test_planner_says_when_bounds_cannot_hold():
    """min_nodes are counted against every node a platform holds (pool members or not), so only the
    inventory can show they cannot all hold: the plan then says so instead of a bare 'optimal'."""
    from gpupool.decisions.planner import NodeRecord, plan
    from gpupool.decisions.policy import Policy

    nodes = [NodeRecord(name=f"n{i}", owner="a" if i < 2 else "b", gpus=8) for i in range(3)]
    result = plan(nodes, {"a": [4.0, 4.0], "b": [4.0, 4.0]}, Policy(min_nodes={"a": 2, "b": 2}))
    assert "infeasible bounds" in result.status and "add up to 4" in result.status and "3 nodes" in result.status
    assert any("infeasible bounds" in r for r in result.reasons)
    fine = plan(nodes, {"a": [4.0, 4.0], "b": [4.0, 4.0]}, Policy(min_nodes={"a": 1, "b": 2}))
    assert "infeasible" not in fine.status


@pytest.mark.slow
def test_run_warns_when_inventory_cannot_meet_min_nodes(capsys, data, staging):
    """The embedded datacenter holds 30 nodes; minimums of 3 x 20 cannot all hold."""
    path = _config(data, "".join(
        f"  - {{name: {p}, kind: simulator, min_nodes: 20}}\n" for p in ("openstack", "slurm", "kubernetes")
    ).join(["platforms:\n", ""]))
    rc, out, err = _cli(capsys, "run", "--config", str(path), "--start", "2026-11-01T09:00Z", "--end",
                        "2026-11-01T12:00Z", "--policy", "reactive")
    assert rc == 0, err
    warning = [line for line in out.splitlines() if "warning: infeasible bounds" in line]
    assert len(warning) == 1 and "add up to 60" in warning[0] and "30 nodes" in warning[0]


# --- staging, windows, platforms, handovers --------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [("summary", *WINDOW), ("plan", "--at", "2026-11-01T01:00Z"), ("handovers",)],
    ids=["summary", "plan", "handovers"],
)
def test_unreachable_staging_names_the_connection_never_the_uri(capsys, data, monkeypatch, argv):
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.setenv("GPUPOOL_STAGING_URL", UNREACHABLE)
    line = _refused(capsys, data, *argv, needles=("staging database", "GPUPOOL_STAGING_URL"))
    for secret in ("Sup3rS3cretFAKE", "gpupool:", "127.0.0.1", ":1/", "psycopg", "postgresql"):
        assert secret not in line


def test_unreachable_staging_given_by_option(capsys, data, monkeypatch):
    monkeypatch.delenv("GPUPOOL_STAGING_URL", raising=False)
    line = _refused(capsys, data, "handovers", "--staging-url", UNREACHABLE, needles=("staging database", "URL given"))
    assert "Sup3rS3cretFAKE" not in line and "127.0.0.1" not in line


@pytest.mark.parametrize(
    "argv",
    [("summary", *WINDOW), ("plan", "--at", "2026-11-01T01:00Z"), ("handovers",), ("rollback", "1")],
    ids=["summary", "plan", "handovers", "rollback"],
)
def test_staging_never_upgraded(capsys, data, staging, argv):
    _refused(capsys, data, *argv, needles=("staging database", "GPUPOOL_STAGING_URL", "gpupool db upgrade"))


def test_staging_that_cannot_be_opened(capsys, data, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{data}")  # a directory, not a database file
    _refused(capsys, data, "handovers", needles=("staging database", "GPUPOOL_STAGING_URL", "failed"))


@pytest.mark.parametrize(
    "argv",
    [("run", "--platform", "nope", *WINDOW), ("forecast", "--platform", "nope", "--at", "2026-11-01T01:00Z", "--horizon", "3")],
    ids=["run", "forecast"],
)
def test_platform_not_in_the_config(capsys, data, staging, argv):
    _refused(capsys, data, *argv, needles=("'nope'", "openstack", "slurm", "kubernetes"))


@pytest.mark.parametrize("option", ["--start", "--end"])
def test_sql_text_as_a_time(capsys, data, staging, option):
    window = dict(zip(WINDOW[::2], WINDOW[1::2]))
    window[option] = "2026-01-01'; drop table sample;--"
    _refused(capsys, data, "summary", "--start", window["--start"], "--end", window["--end"],
             needles=("not a time", "drop table"))


def test_bad_issue_time_for_plan_and_forecast(capsys, data, staging):
    _refused(capsys, data, "plan", "--at", "yesterday-ish", needles=("not a time",))
    _refused(capsys, data, "forecast", "--platform", "slurm", "--at", "soon", needles=("not a time",))


def test_rollback_of_no_such_handover(capsys, data, staging):
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    _refused(capsys, data, "rollback", "999", needles=("#999",))


def _sqlite(url: str, *statements: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for sql in statements:
            conn.execute(sa.text(sql))
    engine.dispose()


def test_db_upgrade_of_a_database_at_an_unknown_revision(capsys, data, staging):
    _sqlite(staging, "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)",
            "INSERT INTO alembic_version VALUES ('deadbeef0000')")
    _refused(capsys, data, "db", "upgrade", needles=("staging database", "deadbeef0000", "another gpupool version"))


def test_db_upgrade_over_another_tools_handover_table(capsys, data, staging):
    import sqlalchemy as sa

    _sqlite(staging, "CREATE TABLE handover (id INTEGER PRIMARY KEY, note TEXT)", "INSERT INTO handover VALUES (1, 'theirs')")
    _refused(capsys, data, "db", "upgrade", needles=("staging database", "handover", "another tool"))
    engine = sa.create_engine(staging)
    with engine.connect() as conn:  # their table and row untouched, no gpupool table beside it
        assert conn.execute(sa.text("SELECT note FROM handover")).scalars().all() == ["theirs"]
        assert sa.inspect(conn).get_table_names() == ["handover"]
    engine.dispose()


def test_a_read_only_staging_role(capsys, data, monkeypatch):
    """A role that may connect but not create: PostgreSQL's InsufficientPrivilege, one line."""
    import uuid

    import sqlalchemy as sa

    from tests.conftest import PG_URL

    role, schema = f"ro_{uuid.uuid4().hex[:8]}", f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(sa.text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
    try:
        url = sa.make_url(PG_URL).set(username=role, password=None)
        monkeypatch.setenv("GPUPOOL_STAGING_URL", url.render_as_string(hide_password=False) + f"?options=-csearch_path%3D{schema}")
        monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
        _refused(capsys, data, "db", "upgrade", needles=("staging database", "InsufficientPrivilege"))
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()


@pytest.mark.parametrize("value", ["2147484", "99999999999"])
def test_a_statement_timeout_above_postgresqls_maximum(capsys, data, monkeypatch, value):
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.setenv("GPUPOOL_STAGING_URL", UNREACHABLE)
    monkeypatch.setenv("GPUPOOL_STAGING_STATEMENT_TIMEOUT", value)
    line = _refused(capsys, data, "handovers", needles=("GPUPOOL_STAGING_STATEMENT_TIMEOUT", "at most 2147483"))
    assert "unreachable" not in line


@pytest.mark.parametrize("hid", ["99999999999999999999", "2147483648", "0", "-3"])
def test_rollback_of_an_id_beyond_the_id_column(capsys, data, staging, hid):
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    _refused(capsys, data, "rollback", "--", hid, needles=(f"#{hid}",))


def test_a_platform_name_longer_than_staging_holds(capsys, data, staging):
    cfg = data / "platforms.yaml"
    cfg.write_text(f"platforms:\n  - {{name: {'p' * 65}, kind: simulator}}\n")
    _refused(capsys, data, "run", "--config", str(cfg), *WINDOW, needles=("platforms.yaml", "64"))


def test_forecast_reads_the_named_columns(capsys, data, tmp_path):
    ts, v = _series()
    pd.DataFrame({"note": ["x"] * len(ts), "when": ts.strftime("%Y-%m-%dT%H:%M:%S"), "other": 1.0, "gpus": v}).to_csv(
        data / "cols.csv", index=False)
    out = tmp_path / "fc.csv"
    rc, _, err = _cli(capsys, "forecast", str(data / "cols.csv"), "--horizon", "3", "--out", str(out),
                      "--time-col", "when", "--value-col", "gpus")
    assert rc == 0, err
    assert abs(pd.read_csv(out)["yhat"].mean() - v.mean()) < 5  # the gpus column, not "other" (all 1)
    _refused(capsys, data, "forecast", str(data / "cols.csv"), "--horizon", "3", "--out", str(tmp_path / "x.csv"),
             "--value-col", "nope", needles=("nope",))


@pytest.mark.parametrize("season", ["0", "-5", "1"])
def test_forecast_season_below_two_is_refused(capsys, data, tmp_path, season):
    _refused(capsys, data, "forecast", str(data / "good.csv"), "--horizon", "3", "--out", str(tmp_path / "fc.csv"),
             f"--season={season}", needles=("--season", season))


@pytest.mark.parametrize("level", ["1", "99.9"])
def test_the_level_bounds_themselves_are_accepted(capsys, data, level):
    rc, _, err = _cli(capsys, "forecast", str(data / "good.csv"), "--horizon", "3", "--out", str(data / "out.csv"),
                      "--level", level)
    assert rc == 0, err
    fc = pd.read_csv(data / "out.csv")
    assert (fc["yhat_lower"] <= fc["yhat"]).all() and (fc["yhat"] <= fc["yhat_upper"]).all()


# --- outputs of simulate, run and report: never an input, checked before the work ------------


def _trace_scenario(folder: Path) -> Path:
    _helios(folder / "a.csv", [10.0] * 288)
    _helios(folder / "b.csv", [12.0] * 288)
    path = folder / "trace.yaml"
    path.write_text("move_minutes: 30\nplatforms:\n  slurm: {trace: [a.csv]}\n  kubernetes: {trace: [b.csv]}\n")
    return path


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if a simulation starts: a refused output must be refused before it."""
    import gpupool.sim.study as sim_study

    def simulate(*a, **k):
        raise AssertionError("the simulation ran before the output was checked")

    monkeypatch.setattr(sim_study, "simulate", simulate)


@pytest.mark.parametrize("target", ["scenario", "trace", "trace-by-link"])
def test_simulate_json_never_overwrites_its_scenario_or_a_trace(capsys, data, no_simulation, target):
    """`simulate S.yaml --json S.yaml` replaced the scenario with its result and exited 0."""
    scenario = _trace_scenario(data)
    if target == "scenario":
        out, needle = scenario, "scenario"
    elif target == "trace":
        out, needle = data / "b.csv", "platforms.kubernetes.trace.0"
    else:
        (data / "link.csv").symlink_to(data / "a.csv")
        out, needle = data / "link.csv", "platforms.slurm.trace.0"
    _refused(capsys, data, "simulate", str(scenario), "--no-progress", "--json", str(out),
             needles=("--json", needle, "refusing to overwrite"))


def test_simulate_json_into_a_missing_directory_is_refused_before_the_run(capsys, data, no_simulation):
    """Was a bare `[Errno 2]` after the whole simulation."""
    _refused(capsys, data, "simulate", str(_trace_scenario(data)), "--no-progress", "--json",
             str(data / "nope" / "out.json"), needles=("--json", "nope", "does not exist"))


def test_simulate_json_is_written_whole(capsys, data):
    rc, out, err = _cli(capsys, "simulate", str(_trace_scenario(data)), "--no-progress", "--policy", "static",
                        "--json", str(data / "result.json"))
    assert rc == 0, err
    assert _strict((data / "result.json").read_text()) == _strict(out)
    assert not [p.name for p in data.iterdir() if p.name.endswith(".tmp")]


def test_run_json_into_a_missing_directory_is_refused_before_the_run(capsys, data, staging):
    import sqlalchemy as sa

    _refused(capsys, data, "run", *WINDOW, "--json", str(data / "nope" / "report.json"),
             needles=("--json", "nope", "does not exist"))
    assert not sa.inspect(sa.create_engine(staging)).get_table_names()  # nothing staged, not even the schema


def test_report_out_onto_an_existing_file(capsys, data, staging):
    """Was a FileExistsError traceback."""
    _refused(capsys, data, "report", *WINDOW, "--out", str(data / "good.csv"),
             needles=("--out", "good.csv", "not a directory"))


def test_report_out_under_a_missing_directory(capsys, data, staging):
    _refused(capsys, data, "report", *WINDOW, "--out", str(data / "nope" / "report"),
             needles=("--out", "nope", "does not exist"))


def test_report_on_a_window_with_no_data(capsys, data, staging):
    """Was a ReportError traceback; nothing is left behind, not even the report's directory."""
    from gpupool.errors import UserError
    from gpupool.report import ReportError

    assert issubclass(ReportError, UserError)
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    _refused(capsys, data, "report", *WINDOW, "--out", str(data / "report"),
             needles=("no platform samples", "2026-11-01T00:00:00"))


@pytest.mark.parametrize("at", ["0001-01-01", "0001-01-01T00:30:00", "2201-01-01"])
def test_an_at_beyond_the_times_staging_holds(capsys, data, staging, at):
    """`plan --at 0001-01-01` was an OverflowError traceback (the hour before it is no date)."""
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    for argv in (("plan", "--at", at), ("forecast", "--platform", "slurm", "--at", at, "--horizon", "3"),
                 ("fastpath", "--at", at)):
        _refused(capsys, data, *argv, needles=("--at", at, "1970-01-01", "2200-01-01"))


def test_plan_at_a_time_with_no_staged_data(capsys, data, staging):
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    for extra in ((), ("--json",)):
        rc, out, err = _cli(capsys, "plan", "--at", "2026-11-01T01:00Z", *extra)
        assert rc == 0, err
        assert "Traceback" not in err and out


# --- the contract itself ---------------------------------------------------------------------


def test_a_bug_still_shows_its_traceback(data, monkeypatch):
    import gpupool.detect.io as detect_io

    def bug(*a, **k):
        raise ZeroDivisionError("a bug, not a user error")

    monkeypatch.setattr(detect_io, "detect_csv", bug)
    with pytest.raises(ZeroDivisionError):
        main(["detect", str(data / "good.csv"), "--out", str(data / "out.csv")])


def _subprocess(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    include = str(Path(__file__).resolve().parents[3] / "include")
    full = {**os.environ, **(env or {}), "PYTHONPATH": include + os.pathsep + os.environ.get("PYTHONPATH", "")}
    full.pop("GPUPOOL_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "gpupool.cli", *argv], capture_output=True, text=True, env=full, timeout=300)


def test_no_traceback_reaches_stderr_of_a_real_process(data):
    (data / "garbage.csv").write_bytes(b"\xff\xfe\x00garbage\x81" * 100)
    cases = [
        (("detect", str(data / "garbage.csv"), "--out", str(data / "out.csv")), {}, "UTF-8"),
        (("forecast", str(data / "good.csv"), "--horizon", "1e9", "--out", str(data / "out.csv")), {}, "--horizon"),
        (("forecast", str(data / "good.csv"), "--horizon", "3", "--out", str(data / "good.csv")), {}, "input"),
        (("handovers",), {"GPUPOOL_STAGING_URL": UNREACHABLE}, "GPUPOOL_STAGING_URL"),
    ]
    before = _snapshot(data)
    for argv, env, needle in cases:
        done = _subprocess(*argv, env=env)
        assert done.returncode == 2, (argv, done.stderr)
        line = _one_line(done.stderr, needle)
        assert "Sup3rS3cretFAKE" not in line
    assert _snapshot(data) == before
