"""`gpupool whatif`: a scenario from a platform's own history and the user's node counts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpupool.cli import main
from gpupool.errors import UsageError
from gpupool.sim.whatif import parse_ownership, parse_source, whatif_scenario

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "history"


@pytest.fixture
def logs(tmp_path, monkeypatch):
    """The fixture logs copied to a working directory the test runs in."""
    for name in ("jobs.txt", "pods.csv", "demand.csv", "prom_allocated.json", "prom_pending.json"):
        shutil.copy(FIX / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_source_is_format_path_and_keys():
    assert parse_source("sacct:jobs.txt", "--slurm") == {"format": "sacct", "path": "jobs.txt"}
    assert parse_source("pods:p.csv,origin=2023-01-01T00:00:00Z", "--kubernetes") == {
        "format": "pods", "path": "p.csv", "origin": "2023-01-01T00:00:00Z"}
    assert parse_source("prometheus:a.json,pending=b.json", "--slurm") == {
        "format": "prometheus", "allocated": "a.json", "pending": "b.json"}
    assert parse_source("helios/cluster.csv", "--slurm") == "helios/cluster.csv"  # a bare path: Helios
    with pytest.raises(UsageError, match=r"^--slurm sacct:jobs.txt,utc: 'utc' is not key=value$"):
        parse_source("sacct:jobs.txt,utc", "--slurm")


def test_the_window_defaults_to_the_span_the_logs_name(logs):
    scenario, raw = whatif_scenario({"slurm": ["sacct:jobs.txt"], "kubernetes": ["pods:pods.csv,origin=2023-04-26"]},
                                    {"slurm": 3, "kubernetes": 2}, settings={"step": "10min"}, base_dir=logs)
    # the first submit (00:05) and the last end (job 1007 at 06:15), widened to whole steps
    assert pd.Timestamp(scenario.start) == pd.Timestamp("2023-04-26T00:00:00Z")
    assert pd.Timestamp(scenario.end) == pd.Timestamp("2023-04-26T06:20:00Z")
    assert scenario.platforms["slurm"].nodes == 3 and raw["platforms"]["slurm"]["trace"][0]["path"] == str(logs / "jobs.txt")
    given, _ = whatif_scenario({"slurm": ["sacct:jobs.txt"]}, {"slurm": 3}, start="2023-04-26T01:00:00Z",
                               base_dir=logs)
    assert pd.Timestamp(given.start) == pd.Timestamp("2023-04-26T01:00:00Z")
    assert pd.Timestamp(given.end) == pd.Timestamp("2023-04-26T06:15:00Z")


def test_whatif_writes_the_report_and_a_scenario_simulate_reruns_alike(logs, capsys):
    argv = ["whatif", "--slurm", "sacct:jobs.txt", "--slurm-nodes", "2", "--kubernetes",
            "pods:pods.csv,origin=2023-04-26T00:00:00Z", "--kubernetes-nodes", "2", "--start", "2023-04-26T00:00:00Z",
            "--end", "2023-04-26T08:00:00Z", "--move-minutes", "10", "--json", "report.json",
            "--scenario-out", "built.yaml", "--no-progress"]
    assert main(argv) == 0
    report = json.loads((logs / "report.json").read_text())
    assert json.loads(capsys.readouterr().out) == report
    assert set(report["platforms"]) == {"slurm", "kubernetes"} and report["policy"] == "predictive"
    built = yaml.safe_load((logs / "built.yaml").read_text())
    assert built["platforms"]["slurm"] == {"trace": [{"format": "sacct", "path": str(logs / "jobs.txt")}], "nodes": 2}
    # the same scenario as the shipped fixture's: the same study, figure for figure
    assert main(["simulate", str(FIX / "scenario.yaml"), "--no-progress"]) == 0
    fixture = json.loads(capsys.readouterr().out)
    assert main(["simulate", "built.yaml", "--no-progress"]) == 0
    rerun = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in rerun.items() if k != "scenario"} == {k: v for k, v in report.items() if k != "scenario"}
    assert rerun["platforms"] == fixture["platforms"] and rerun["total"] == fixture["total"]


@pytest.mark.parametrize("argv, match", [
    (["--slurm", "sacct:jobs.txt"], r"--slurm-nodes: required with a sacct history \(it carries no capacity\)"),
    (["--slurm", "sacct:jobs.txt", "--slurm-nodes", "2", "--json", "jobs.txt"],
     r"--json jobs.txt is the --slurm file .*jobs.txt; refusing to overwrite it"),
    (["--slurm", "sacct:jobs.txt", "--slurm-nodes", "2", "--scenario-out", "jobs.txt"],
     r"--scenario-out jobs.txt is the --slurm file"),
    (["--slurm", "sacct:nope.txt", "--slurm-nodes", "2"], r"--slurm sacct:nope.txt: no such file .*nope.txt"),
    (["--slurm", "sacct:jobs.txt,origin=0", "--slurm-nodes", "2"],
     r"--slurm sacct:jobs.txt,origin=0: origin: not a key of format sacct"),
    (["--kubernetes", "pods:pods.csv", "--kubernetes-nodes", "2"],
     r"pods.csv: line 2, column creation_time: '0' is seconds from the trace's origin; give origin"),
    (["--openstack-nodes", "2", "--slurm", "sacct:jobs.txt", "--slurm-nodes", "2"], r"--openstack-nodes 2: without --openstack"),
    ([], r"give at least one platform's history"),
])
def test_whatif_errors_are_one_line(logs, capsys, argv, match):
    assert main(["whatif", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpupool whatif: error: ")
    assert re.search(match, err), err
    assert not (logs / "report.json").exists()


@pytest.mark.parametrize("text, match", [
    ("sacct:jobs.txt,path=/etc/shadow", r"path is given by sacct:jobs\.txt; a key may not set it again"),
    ("sacct:jobs.txt,format=csv", r"format is given by sacct:jobs\.txt; a key may not set it again"),
    ("prometheus:a.json,allocated=b.json", r"allocated is given by prometheus:a\.json"),
    ("pods:p.csv,origin=2023-01-01,origin=2024-01-01", r"origin is given twice"),
])
def test_a_key_may_not_say_again_what_the_source_fixes(text, match):
    with pytest.raises(UsageError, match=rf"^--slurm {re.escape(text)}: {match}"):
        parse_source(text, "--slurm")


def test_whatif_of_a_log_without_usable_jobs_says_so_and_why(logs, capsys):
    (logs / "steps.txt").write_text(
        "JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition\n"
        "7.batch|2023-04-26T00:00:00|2023-04-26T00:00:00|2023-04-26T01:00:00|COMPLETED|gres/gpu=1||gpu\n"
        "8|2023-04-26T00:00:00|2023-04-26T00:00:00|2023-04-26T01:00:00|COMPLETED|cpu=4|cpu=4|gpu\n")
    assert main(["whatif", "--slurm", "sacct:steps.txt", "--slurm-nodes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "start and end are required" not in err
    assert re.search(r"steps\.txt: no usable jobs in 2 rows \(job steps: 1, without GPUs: 1\), so nothing to take the "
                     r"what-if's window from", err), err


@pytest.mark.parametrize("name, text, source, match", [
    ("text.csv", "ts,gpus\n2023-04-26T00:00:00Z,a\n2023-04-26T00:10:00Z,b\n", "csv:text.csv,value_col=gpus",
     r"text\.csv: column 'gpus': no number in its 2 rows"),
    ("nan.json", '{"status": "success", "data": {"resultType": "matrix", "result": [{"values": '
     '[["NaN", "1"], [1682467200, "2"]]}]}}', "prometheus:nan.json", r"nan\.json: data\.result\[0\]\.values\[0\]: "
     r"time 'NaN' is not a time"),
    ("far.csv", "name,creation_time,scheduled_time,deletion_time,num_gpu,gpu_milli\na,0,10,7200,1,1000\n",
     "pods:far.csv,origin=9999-12-31T00:00:00Z", r"far\.csv: line 2, column creation_time: '0' seconds from origin is "
     r"9999-12-31T00:00:00\+00:00, outside the times a history may name \(1970-01-01 \.\. 2200-01-01\)"),
])
def test_whatif_names_what_is_wrong_with_times_and_values(logs, capsys, name, text, source, match):
    """Not a move_minutes that outlasts a window of NaN times, nor a year wrapped around to 1972."""
    (logs / name).write_text(text)
    assert main(["whatif", "--slurm", source, "--slurm-nodes", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "move_minutes" not in err and re.search(match, err), err


def test_ownership_options_give_each_platform_its_keys():
    study = {"slurm": ["sacct:jobs.txt"], "kubernetes": ["pods:pods.csv"]}
    given = {"owns": ["slurm=1"], "lend_limit": None, "borrow_limit": ["kubernetes=0"],
             "reclaim_minutes": ["30", "kubernetes=45"], "min_runtime_minutes": ["10"]}
    # a bare value holds for every platform of the study, PLATFORM=VALUE over it for that one
    assert parse_ownership(given, study) == {
        "slurm": {"owns": 1, "reclaim_minutes": 30.0, "min_runtime_minutes": 10.0},
        "kubernetes": {"borrow_limit": 0, "reclaim_minutes": 45.0, "min_runtime_minutes": 10.0}}
    assert parse_ownership({"owns": None, "reclaim_minutes": []}, study) == {}


WHATIF_ARGV = ["whatif", "--slurm", "sacct:jobs.txt", "--slurm-nodes", "2", "--kubernetes",
               "pods:pods.csv,origin=2023-04-26T00:00:00Z", "--kubernetes-nodes", "2", "--move-minutes", "10",
               "--no-progress"]
OWNERSHIP_KEYS = {"owned_gpus", "lent_gpu_hours", "borrowed_gpu_hours", "regret_gpu_hours", "reclaims",
                  "preempted_gpu_hours"}


def test_whatif_with_reclaim_minutes_reports_ownership_per_platform(logs, capsys):
    argv = [*WHATIF_ARGV, "--reclaim-minutes", "30", "--lend-limit", "kubernetes=1", "--scenario-out", "built.yaml"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    built = yaml.safe_load((logs / "built.yaml").read_text())
    assert {k: v for k, v in built["platforms"]["slurm"].items() if k != "trace"} == {
        "nodes": 2, "reclaim_minutes": 30.0}
    assert {k: v for k, v in built["platforms"]["kubernetes"].items() if k != "trace"} == {
        "nodes": 2, "lend_limit": 1, "reclaim_minutes": 30.0}
    for name, block in report["platforms"].items():
        assert OWNERSHIP_KEYS <= set(block), name
        assert block["owned_gpus"] == 16  # every platform owns the two nodes it starts with
        assert set(block["reclaims"]) == {"count", "late", "p50_minutes", "p95_minutes", "max_minutes"}
    # the regret is each platform's unmet against static's on the same scenario
    assert main(["simulate", "built.yaml", "--policy", "static", "--no-progress"]) == 0
    static = json.loads(capsys.readouterr().out)
    for name, block in report["platforms"].items():
        expected = block["unmet_gpu_hours"] - static["platforms"][name]["unmet_gpu_hours"]
        assert block["regret_gpu_hours"] == pytest.approx(expected, abs=1e-3)
    assert any(block["regret_gpu_hours"] != 0 for block in report["platforms"].values())  # pooling changed something
    assert report["platforms"]["kubernetes"]["lent_gpu_hours"] == report["platforms"]["slurm"]["borrowed_gpu_hours"]
    # the scenario written reruns to the same figures under `gpupool simulate`
    assert main(["simulate", "built.yaml", "--no-progress"]) == 0
    rerun = json.loads(capsys.readouterr().out)
    assert rerun["platforms"] == report["platforms"] and rerun["total"] == report["total"]


def test_whatif_without_ownership_options_reports_as_before(logs, capsys):
    """No option, no key: the scenario and the report are those of a scenario without ownership."""
    assert main([*WHATIF_ARGV, "--scenario-out", "built.yaml"]) == 0
    report = json.loads(capsys.readouterr().out)
    built = yaml.safe_load((logs / "built.yaml").read_text())
    assert {k for p in built["platforms"].values() for k in p} == {"trace", "nodes"}
    assert not OWNERSHIP_KEYS & {k for block in (report["total"], *report["platforms"].values()) for k in block}
