"""A platform's own history as demand: sacct, a pod list, Prometheus answers and a plain CSV.

Each reader's demand is checked against demand computed here from the same rows by a plain
loop over minutes (seconds for the pod list, whose times are seconds), never against numbers
the reader itself produced.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.parse
import zoneinfo
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpupool.sim.history import HistoryError, HistorySpec, read_history, read_traces
from gpupool.sim.scenario import ScenarioError, load_scenario, scenario_from_dict

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "history"
START, END = pd.Timestamp("2023-04-26T00:00:00Z"), pd.Timestamp("2023-04-26T08:00:00Z")


def _grid(step: str) -> pd.DatetimeIndex:
    return pd.date_range(START, END, freq=step, inclusive="left")


def _per_step(level_at, step: str, tick: dt.timedelta) -> np.ndarray:
    """Mean of ``level_at(t)`` over the ticks of each step (a left Riemann sum of width ``tick``)."""
    out = []
    for t0 in _grid(step):
        ticks = pd.date_range(t0, t0 + pd.Timedelta(step), freq=tick, inclusive="left")
        out.append(sum(level_at(t) for t in ticks) / len(ticks))
    return np.array(out)


def _level(boxes, t) -> float:
    """GPUs of the boxes ``(begin, end, gpus)`` live at ``t`` (end None: open)."""
    return sum(g for b, e, g in boxes if b <= t and (e is None or t < e))


# ------------------------------------------------------------------------------------ sacct
def _sacct_boxes(path: Path, zone: str = "UTC"):
    """Running and pending boxes of a sacct file, read here by hand."""
    tz = zoneinfo.ZoneInfo(zone)

    def when(text):
        if text in ("Unknown", "None", ""):
            return None
        return pd.Timestamp(dt.datetime.fromisoformat(text).replace(tzinfo=tz)).tz_convert("UTC")

    def gpus(tres):
        items = dict(i.split("=", 1) for i in tres.split(",") if i)
        if "gres/gpu" in items:
            return int(items["gres/gpu"])
        return sum(int(v) for k, v in items.items() if k.startswith("gres/gpu:"))

    lines = path.read_text().splitlines()
    head = lines[0].split("|")
    running, pending = [], []
    for line in lines[1:]:
        row = dict(zip(head, line.split("|")))
        if "." in row["JobID"]:
            continue
        submit, start, end = when(row["Submit"]), when(row["Start"]), when(row["End"])
        pending.append((submit, start if start is not None else end, gpus(row["ReqTRES"])))
        if start is not None:
            running.append((start, end, gpus(row["AllocTRES"])))
    return running, pending


def test_sacct_demand_equals_a_minute_by_minute_count():
    got = read_history(HistorySpec(format="sacct", path=FIX / "jobs.txt"), pd.Timedelta("15min"), START, END)
    running, pending = _sacct_boxes(FIX / "jobs.txt")
    minute = dt.timedelta(minutes=1)
    np.testing.assert_allclose(got["running"], _per_step(lambda t: _level(running, t), "15min", minute), atol=1e-9)
    np.testing.assert_allclose(got["pending"], _per_step(lambda t: _level(pending, t), "15min", minute), atol=1e-9)
    np.testing.assert_allclose(got["demand"], got["running"] + got["pending"])
    assert got.index.equals(_grid("15min")) and str(got.index.dtype) == "datetime64[us, UTC]"
    # the never-started job waits to the window's end; the running one runs to it
    assert got["pending"].iloc[-1] == 16 and got["running"].iloc[-1] == 2


def test_sacct_local_times_are_read_in_the_given_zone():
    berlin = read_history(HistorySpec(format="sacct", path=FIX / "jobs.txt", timezone="Europe/Berlin"),
                          pd.Timedelta("5min"), START - pd.Timedelta(hours=2), END - pd.Timedelta(hours=2))
    utc = read_history(HistorySpec(format="sacct", path=FIX / "jobs.txt"), pd.Timedelta("5min"), START, END)
    # Berlin is two hours ahead in April: its wall times are the same instants two hours earlier
    np.testing.assert_allclose(berlin["demand"].to_numpy(), utc["demand"].to_numpy())
    running, _ = _sacct_boxes(FIX / "jobs.txt", "Europe/Berlin")
    assert running[0][0] == pd.Timestamp("2023-04-25T22:10:00Z")
    assert berlin.loc["2023-04-25T22:10:00Z", "running"] == 4 and berlin.loc["2023-04-25T22:05:00Z", "running"] == 0


def test_a_pending_jobs_estimated_start_is_not_a_start(tmp_path):
    path = tmp_path / "jobs.txt"
    path.write_text("JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition\n"
                    "9|2023-04-26T01:00:00|2023-04-26T03:00:00|Unknown|PENDING||cpu=8,gres/gpu=4|gpu\n")
    got = read_history(HistorySpec(format="sacct", path=path), pd.Timedelta("1h"), START, END)
    assert list(got["pending"]) == [0, 4, 4, 4, 4, 4, 4, 4] and got["running"].eq(0).all()


def test_a_requeued_job_started_before_its_submit_did_not_wait_and_an_empty_log_is_no_demand(tmp_path):
    path = tmp_path / "jobs.txt"
    path.write_text("JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition\n"
                    "9|2023-04-26T02:00:00|2023-04-26T01:00:00|2023-04-26T03:00:00|COMPLETED|gres/gpu=4|gres/gpu=4|gpu\n")
    got = read_history(HistorySpec(format="sacct", path=path), pd.Timedelta("1h"), START, END)
    assert list(got["running"]) == [0, 4, 4, 0, 0, 0, 0, 0] and got["pending"].eq(0).all()
    path.write_text("JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition\n")
    assert read_history(HistorySpec(format="sacct", path=path), pd.Timedelta("1h"), START, END)["demand"].eq(0).all()


def test_sacct_partition_filter_keeps_jobs_of_those_partitions():
    debug = read_history(HistorySpec(format="sacct", path=FIX / "jobs.txt", partition="debug"),
                         pd.Timedelta("5min"), START, END)
    # job 1006 (gpu,debug: cancelled while pending) and job 1007 (debug, typed gres/gpu:a100=2)
    assert debug.loc["2023-04-26T03:10:00Z", "pending"] == 1 and debug.loc["2023-04-26T04:00:00Z", "pending"] == 0
    assert debug.loc["2023-04-26T05:00:00Z", "running"] == 2
    # 1007 waits one minute of the 04:30 step for its two GPUs; the gpu partition's jobs are gone
    assert debug.loc["2023-04-26T04:30:00Z", "pending"] == pytest.approx(0.4)
    assert debug["running"].max() == 2 and debug["pending"].max() == 1


# ------------------------------------------------------------------------------------- pods
def _pod_boxes(path: Path, origin: pd.Timestamp):
    import csv

    running, pending = [], []
    with path.open() as f:
        for row in csv.DictReader(f):
            def when(col):
                return origin + pd.Timedelta(seconds=float(row[col])) if row[col] else None

            gpus = int(row["num_gpu"])
            if gpus == 1 and int(row["gpu_milli"]) < 1000:
                gpus = int(row["gpu_milli"]) / 1000
            created, scheduled, deleted = when("creation_time"), when("scheduled_time"), when("deletion_time")
            pending.append((created, scheduled if scheduled is not None else deleted, gpus))
            if scheduled is not None:
                running.append((scheduled, deleted, gpus))
    return running, pending


def test_pod_demand_with_fractional_gpus_equals_a_second_by_second_count():
    got = read_history(HistorySpec(format="pods", path=FIX / "pods.csv", origin="2023-04-26T00:00:00Z"),
                       pd.Timedelta("30min"), START, END)
    running, pending = _pod_boxes(FIX / "pods.csv", START)
    second = dt.timedelta(seconds=1)
    np.testing.assert_allclose(got["running"], _per_step(lambda t: _level(running, t), "30min", second), atol=1e-9)
    np.testing.assert_allclose(got["pending"], _per_step(lambda t: _level(pending, t), "30min", second), atol=1e-9)
    # a half GPU, a quarter and a third of one: the tail of the window holds only shares
    assert got["running"].iloc[-1] == pytest.approx(0.5) and got["pending"].iloc[-1] == pytest.approx(0.25)
    assert (got["demand"] % 1 > 1e-6).any()


def test_pod_times_may_be_iso_and_naive_ones_follow_the_zone(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text("name,creation_time,scheduled_time,deletion_time,num_gpu,gpu_milli\n"
                    "a,2023-04-26T01:00:00Z,2023-04-26T01:30:00Z,2023-04-26T02:00:00Z,2,1000\n"
                    "b,2023-04-26 05:00:00,,,1,500\n")
    got = read_history(HistorySpec(format="pods", path=path, timezone="America/New_York"),
                       pd.Timedelta("30min"), START, END + pd.Timedelta(hours=2))
    assert list(got.loc["2023-04-26T01:00:00Z":"2023-04-26T01:30:00Z", "pending"]) == [2, 0]
    assert got.loc["2023-04-26T01:30:00Z", "running"] == 2 and got.loc["2023-04-26T02:00:00Z", "running"] == 0
    # 05:00 in New York (EDT) is 09:00 UTC; never scheduled nor deleted: pending to the end
    assert got.loc["2023-04-26T08:30:00Z", "pending"] == 0 and got.loc["2023-04-26T09:00:00Z", "pending"] == 0.5


# ------------------------------------------------------------------------------ prometheus
def _answer_sum(path: Path) -> dict[pd.Timestamp, float]:
    doc = json.loads(path.read_text())
    out: dict[pd.Timestamp, float] = {}
    for series in doc["data"]["result"]:
        for t, v in series["values"]:
            ts = pd.Timestamp(float(t), unit="s", tz="UTC")
            out[ts] = out.get(ts, 0.0) + float(v)
    return out


def _bin_mean(samples: dict[pd.Timestamp, float], step: str, empty: float | None) -> np.ndarray:
    out, last = [], None
    for t0 in _grid(step):
        vals = [v for t, v in samples.items() if t0 <= t < t0 + pd.Timedelta(step)]
        if vals:
            last = sum(vals) / len(vals)
        out.append(last if not vals and empty is None else (sum(vals) / len(vals) if vals else empty))
    return np.array(out, dtype=float)


def test_prometheus_answers_are_summed_per_timestamp_and_averaged_per_step():
    spec = HistorySpec(format="prometheus", allocated=FIX / "prom_allocated.json", pending=FIX / "prom_pending.json")
    got = read_history(spec, pd.Timedelta("20min"), START, END)
    np.testing.assert_allclose(got["running"], _bin_mean(_answer_sum(FIX / "prom_allocated.json"), "20min", 0.0))
    pending = _bin_mean(_answer_sum(FIX / "prom_pending.json"), "20min", 0.0)
    np.testing.assert_allclose(got["pending"], pending)
    assert got.loc["2023-04-26T05:00:00Z", "pending"] == 0  # the answer has no point there: nothing pending


class _Prometheus(http.server.BaseHTTPRequestHandler):
    """A Prometheus HTTP API answering query_range from the answer files, by query name."""

    points: list[int] = []  # points asked per request, as Prometheus counts them

    def do_GET(self):  # noqa: N802 - http.server's hook
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        if "start" in query:
            span = float(query["end"][0]) - float(query["start"][0])
            self.points.append(int(span // float(query["step"][0])) + 1)
        name = {"gpus_allocated": "prom_allocated.json", "gpus_pending": "prom_pending.json"}.get(query["query"][0])
        if url.path != "/api/v1/query_range" or name is None:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"status":"error","error":"unknown query"}')
            return
        doc = json.loads((FIX / name).read_text())
        lo, hi = float(query["start"][0]), float(query["end"][0])
        for s in doc["data"]["result"]:
            s["values"] = [p for p in s["values"] if lo <= p[0] <= hi]
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus(monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):  # a proxy the environment names never stands before loopback
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    _Prometheus.points = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_live_prometheus_reads_as_its_answer_files_do(prometheus):
    files = read_history(HistorySpec(format="prometheus", allocated=FIX / "prom_allocated.json",
                                     pending=FIX / "prom_pending.json"), pd.Timedelta("10min"), START, END)
    live = read_history(HistorySpec(format="prometheus", url=prometheus, allocated_query="gpus_allocated",
                                    pending_query="gpus_pending", step="5m"), pd.Timedelta("10min"), START, END)
    pd.testing.assert_frame_equal(live, files)
    # nine days at one minute is more than one answer may hold (11,000 points): read in parts
    _Prometheus.points.clear()
    long_end = START + pd.Timedelta(days=9)
    longer = read_history(HistorySpec(format="prometheus", url=prometheus, allocated_query="gpus_allocated",
                                      step="1m"), pd.Timedelta("10min"), START, long_end)
    assert len(_Prometheus.points) == 2 and max(_Prometheus.points) <= 11_000
    assert sum(_Prometheus.points) == 9 * 24 * 60
    np.testing.assert_allclose(longer["running"].iloc[:48], files["running"])
    assert (longer["running"].iloc[48:] == 0).all()  # no sample: no series, nothing allocated
    with pytest.raises(HistoryError, match=r"^http://127\.0\.0\.1:\d+: query 'nope' failed \(HTTP Status Code 400"):
        read_history(HistorySpec(format="prometheus", url=prometheus, allocated_query="nope"),
                     pd.Timedelta("10min"), START, END)


# ------------------------------------------------------------------------------------- csv
def test_csv_columns_read_as_detect_reads_them_with_gaps_carried():
    got = read_history(HistorySpec(format="csv", path=FIX / "demand.csv", time_col="ts", value_col="gpus",
                                   pending_col="queued"), pd.Timedelta("30min"), START, END)
    rows = [line.split(",") for line in (FIX / "demand.csv").read_text().splitlines()[1:]]
    gpus = {pd.Timestamp(r[0]): float(r[1]) for r in rows}
    queued = {pd.Timestamp(r[0]): float(r[2]) for r in rows}
    np.testing.assert_allclose(got["running"], _bin_mean(gpus, "30min", None))
    np.testing.assert_allclose(got["pending"], _bin_mean(queued, "30min", None))
    # a CSV's missing step carries the one before (a silent exporter), as Helios traces do
    wide = read_history(HistorySpec(format="csv", path=FIX / "demand.csv", time_col="ts", value_col="gpus"),
                        pd.Timedelta("1h"), START, END + pd.Timedelta(hours=2))
    assert wide["running"].iloc[-1] == wide["running"].iloc[-3] and wide["pending"].eq(0).all()


# -------------------------------------------------------------------------------- bad rows
SACCT_HEAD = "JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition\n"
POD_HEAD = "name,creation_time,scheduled_time,deletion_time,num_gpu,gpu_milli\n"


@pytest.mark.parametrize("name, text, spec, match", [
    ("jobs.txt", SACCT_HEAD + "1|2023-04-26T00:00:00|2023-04-26T00:01:00|2023-04-26T01:00:00|COMPLETED|gres/gpu=1||gpu\n"
     "2|2023-04-26T00:00:00|yesterday|2023-04-26T01:00:00|COMPLETED|gres/gpu=1||gpu\n", {"format": "sacct"},
     r"jobs\.txt: line 3, column Start: 'yesterday' is not a time"),
    ("jobs.txt", SACCT_HEAD + "1|2023-04-26T00:00:00|2023-04-26T00:01:00|COMPLETED|gres/gpu=1||gpu\n",
     {"format": "sacct"}, r"jobs\.txt: line 2: 7 fields, the header names 8"),
    ("jobs.txt", SACCT_HEAD + "\n1|2023-04-26T00:00:00|2023-04-26T00:01:00|2023-04-26T01:00:00|COMPLETED|gres/gpu=two||gpu\n",
     {"format": "sacct"}, r"jobs\.txt: line 3, column AllocTRES: 'gres/gpu=two' is not a whole GPU count"),
    ("jobs.txt", SACCT_HEAD + "1|2023-04-26T02:00:00|2023-04-26T03:00:00|2023-04-26T02:30:00|COMPLETED|gres/gpu=1||gpu\n",
     {"format": "sacct"}, r"jobs\.txt: line 2: End 2023-04-26 02:30:00\+00:00 is before Start 2023-04-26 03:00:00"),
    ("jobs.txt", SACCT_HEAD + "1|2023-04-26T02:00:00|None|2023-04-26T01:30:00|CANCELLED||gres/gpu=1|gpu\n",
     {"format": "sacct"}, r"jobs\.txt: line 2: End 2023-04-26 01:30:00\+00:00 is before Submit"),
    ("pods.csv", POD_HEAD + "a,0,10,20,inf,1000\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"pods\.csv: line 2, column num_gpu: 'inf' is not a GPU count"),
    ("jobs.txt", "JobID|Submit|End\n", {"format": "sacct"}, r"jobs\.txt: line 1: not sacct --parsable2 output .* missing Start"),
    ("pods.csv", POD_HEAD + "a,0,10,20,1,1000\nb,0,10,20,-1,1000\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"pods\.csv: line 3, column num_gpu: '-1' is not a GPU count"),
    ("pods.csv", POD_HEAD + "a,0,10,20,1.5,1000\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"pods\.csv: line 2, column num_gpu: '1.5' is not a GPU count"),
    ("pods.csv", POD_HEAD + "a,100,10,200,1,1000\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"pods\.csv: line 2: scheduled_time .* is before creation_time"),
    ("pods.csv", POD_HEAD + "a,0,10,20,1,1000\n", {"format": "pods"},
     r"pods\.csv: line 2, column creation_time: '0' is seconds from the trace's origin; give origin"),
    ("pods.csv", POD_HEAD + "\na,0,soon,20,1,1000\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"pods\.csv: line 3, column scheduled_time: 'soon' is neither seconds nor an ISO 8601 time"),
    ("demand.csv", "ts,gpus\n2023-04-26T00:00:00Z,3\n2023-04-26T00:10:00Z,-2\n", {"format": "csv", "value_col": "gpus"},
     r"demand\.csv: line 3, column 'gpus': value -2\.0 is a negative GPU count"),
    ("demand.csv", "ts,gpus\n" + "".join(f"2023-04-26T0{h}:00:00Z,3\n" for h in range(10)) + "later,2\n",
     {"format": "csv", "time_col": "ts"}, r"demand\.csv: line 12, column 'ts': 'later' is not a timestamp"),
    ("demand.csv", "ts,gpus\n2023-04-26T00:00:00Z,3\n2023-04-26T00:00:00Z,2\n", {"format": "csv"},
     r"demand\.csv: line 3, column 'ts': timestamp .* repeats line 2; .* or pass duplicates: first\|last\|mean"),
    ("a.json", '{"status": "success", "data": {"resultType": "matrix", "result": [{"values": [[1682467200, "x"]]}]}}',
     {"format": "prometheus"}, r"a\.json: data\.result\[0\]\.values\[0\]: \[1682467200, 'x'\] is not \[time, \"value\"\]"),
    ("a.json", '{"status": "success",\n "data": {"resultType": "vector", "result": []}}', {"format": "prometheus"},
     r"a\.json: not a query_range answer"),
    ("a.json", '{"status": "success",\n "data": ', {"format": "prometheus"}, r"a\.json: line 2: not JSON"),
])
def test_a_bad_row_is_one_line_naming_the_file_and_line(tmp_path, name, text, spec, match):
    path = tmp_path / name
    path.write_text(text)
    key = "allocated" if spec["format"] == "prometheus" else "path"
    with pytest.raises(HistoryError) as info:
        read_history(HistorySpec(**spec, **{key: path}), pd.Timedelta("5min"), START, END)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path) + ":")
    assert __import__("re").search(match, message), message


# ------------------------------------------------------------------------------- scenario
def test_the_fixture_scenario_resolves_history_paths_and_feeds_the_world():
    from gpupool.sim.world import World

    scenario = load_scenario(FIX / "scenario.yaml")
    slurm = scenario.platforms["slurm"]
    assert slurm.history()[0].path == FIX / "jobs.txt" and slurm.trace_files() == [FIX / "jobs.txt"]
    world = World(scenario)
    jobs = read_traces(slurm.trace, pd.Timedelta("5min"), START, END)
    np.testing.assert_allclose(world.demand_[world.platforms.index("slurm")], jobs["demand"])
    assert len(world.nodes) == 4 and world.start == START and world.end == END


@pytest.mark.parametrize("platforms, extra, match", [
    ({"slurm": {"trace": [{"format": "sacct", "path": "jobs.txt"}]}}, {},
     r"platforms\.slurm: Value error, nodes: required with a sacct trace|platforms\.slurm: nodes: required with a sacct trace"),
    ({"slurm": {"nodes": 3, "trace": [{"format": "sacct", "path": "jobs.txt"}]}}, {"start": None},
     r"start and end are required with a sacct trace \(platforms\.slurm\)"),
    ({"slurm": {"nodes": 3, "trace": [{"format": "sacct", "path": "jobs.txt", "origin": "2023-01-01"}]}}, {},
     r"platforms\.slurm\.trace: entry 0: origin: not a key of format sacct"),
    ({"slurm": {"nodes": 3, "trace": [{"format": "slurmdb", "path": "jobs.txt"}]}}, {},
     r"platforms\.slurm\.trace: entry 0: format: Input should be 'helios', 'sacct'"),
    ({"slurm": {"nodes": 3, "trace": [{"format": "prometheus", "allocated": "prom_allocated.json",
                                        "url": "http://x"}]}}, {},
     r"entry 0: format prometheus: give 'allocated'"),
    ({"slurm": {"nodes": 3, "trace": [{"format": "pods", "path": "missing.csv"}]}}, {},
     r"platforms\.slurm\.trace\.0\.path: no such file"),
])
def test_scenario_errors_name_the_key(platforms, extra, match):
    raw = {"start": "2023-04-26T00:00:00Z", "end": "2023-04-26T08:00:00Z", "platforms": platforms, **extra}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ScenarioError, match=match):
        scenario_from_dict(raw, base_dir=FIX, where="s.yaml")


def test_a_helios_mapping_is_the_plain_path(helios):
    path = helios("h", [4] * 120, 16)
    plain = scenario_from_dict({"platforms": {"slurm": {"trace": [str(path)]}}})
    mapped = scenario_from_dict({"platforms": {"slurm": {"trace": [{"format": "helios", "path": str(path)}]}}})
    assert plain.platforms["slurm"].trace == mapped.platforms["slurm"].trace == [path.resolve()]


def test_helios_and_history_of_one_platform_are_summed(helios, tmp_path):
    path = helios("h", [4] * 600, 16, start="2023-04-26 00:00:00")
    sc = scenario_from_dict({"start": "2023-04-26T01:00:00Z", "end": "2023-04-26T08:00:00Z", "platforms": {
        "slurm": {"nodes": 2, "trace": [str(path), {"format": "sacct", "path": str(FIX / "jobs.txt")}]}}})
    got = read_traces(sc.platforms["slurm"].trace, pd.Timedelta("5min"), pd.Timestamp(sc.start), pd.Timestamp(sc.end))
    jobs = read_history(HistorySpec(format="sacct", path=FIX / "jobs.txt"), pd.Timedelta("5min"),
                        pd.Timestamp(sc.start), pd.Timestamp(sc.end))
    np.testing.assert_allclose(got["demand"], jobs["demand"] + 4)
    assert got["total"].eq(16).all()


def _gpu_hours(boxes) -> float:
    """GPU-hours of the boxes inside [START, END) (an open box runs to END)."""
    return sum(g * ((min(e or END, END) - max(b, START)).total_seconds() / 3600)
               for b, e, g in boxes if b < END and (e is None or e > START))


def test_simulate_runs_a_scenario_of_a_sacct_and_a_pod_platform(tmp_path):
    """End to end through the CLI: the study's demand is the GPU-hours of the logs' jobs."""
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[3] / "include"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "gpupool.cli", "simulate", str(FIX / "scenario.yaml"), "--json",
                           str(out), "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    slurm = sum(map(_gpu_hours, _sacct_boxes(FIX / "jobs.txt")))
    pods = sum(map(_gpu_hours, _pod_boxes(FIX / "pods.csv", START)))
    assert result["platforms"]["slurm"]["demand_gpu_hours"] == pytest.approx(slurm, abs=1e-3)
    assert result["platforms"]["kubernetes"]["demand_gpu_hours"] == pytest.approx(pods, abs=1e-3)
    total = result["total"]
    assert total["served_gpu_hours"] + total["unmet_gpu_hours"] == pytest.approx(slurm + pods, abs=2e-3)
    # four nodes of eight GPUs for eight hours
    assert total["capacity_gpu_hours"] <= 4 * 8 * 8 + 1e-6
    # an output that is one of the scenario's history files is refused before anything runs
    refused = subprocess.run([sys.executable, "-m", "gpupool.cli", "simulate", str(FIX / "scenario.yaml"), "--json",
                              str(FIX / "pods.csv"), "--no-progress"], capture_output=True, text=True, env=env,
                             timeout=300)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "refusing to overwrite" in refused.stderr and "platforms.kubernetes.trace.0" in refused.stderr


# ------------------------------------------------------------------ hostile but fair input
def _sacct_row(jobid="1", gpus="4", submit="2023-04-26T00:00:00", start="2023-04-26T00:10:00",
               end="2023-04-26T02:00:00", partition="gpu") -> str:
    return f"{jobid}|{submit}|{start}|{end}|COMPLETED|cpu=4,gres/gpu={gpus}|cpu=4,gres/gpu={gpus}|{partition}\n"


def _refused(path: Path, spec: dict, match: str) -> str:
    """The one-line HistoryError reading ``path`` as ``spec`` gives; it names the file first."""
    key = "allocated" if spec["format"] == "prometheus" else "path"
    with pytest.raises(HistoryError) as info:
        read_history(HistorySpec(**spec, **{key: path}), pd.Timedelta("5min"), START, END)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}:"), message
    assert __import__("re").search(match, message), message
    return message


def _prom(points) -> str:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [{"values": points}]}})


def test_gpu_counts_beyond_the_bound_are_refused_naming_file_line_and_field(tmp_path):
    """Counts that wrapped around in 64 bits (read as 0.384 GPU), dropped a job or raised a traceback
    are refused; the bound itself still reads."""
    from gpupool.sim.traces import MAX_GPU_COUNT

    path = tmp_path / "jobs.txt"
    for gpus in ("18446744073709552", str(2**63 - 1), str(10**16), str(2**63), str(MAX_GPU_COUNT + 1)):
        path.write_text(SACCT_HEAD + _sacct_row() + _sacct_row("2", gpus))
        _refused(path, {"format": "sacct"},
                 rf"line 3, column AllocTRES: 'gres/gpu={gpus}' is beyond 1,000,000 GPUs \(MAX_GPU_COUNT\)$")
    # typed forms summed past the bound
    path.write_text(SACCT_HEAD + "1|2023-04-26T00:00:00|2023-04-26T00:10:00|2023-04-26T02:00:00|COMPLETED|"
                    f"gres/gpu:a100={MAX_GPU_COUNT},gres/gpu:h100=1||gpu\n")
    _refused(path, {"format": "sacct"}, r"line 2, column AllocTRES: .* is beyond 1,000,000 GPUs")
    path.write_text(SACCT_HEAD + _sacct_row(gpus=str(MAX_GPU_COUNT)))
    got = read_history(HistorySpec(format="sacct", path=path), pd.Timedelta("1h"), START, END)
    assert got["running"].iloc[1] == MAX_GPU_COUNT
    pods = tmp_path / "pods.csv"
    pods.write_text(POD_HEAD + "a,0,10,7200,1,1000\nb,0,10,7200,1e17,1000\n")
    _refused(pods, {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
             r"line 3, column num_gpu: '1e17' is beyond 1,000,000 GPUs \(MAX_GPU_COUNT\)")
    pods.write_text(POD_HEAD + "a,0,10,7200,1,1e17\n")
    _refused(pods, {"format": "pods", "origin": "2023-04-26T00:00:00Z"}, r"line 2, column gpu_milli: '1e17' is beyond")
    answer = tmp_path / "a.json"
    answer.write_text(_prom([[1682467200, "3"], [1682467260, "2e6"]]))
    _refused(answer, {"format": "prometheus"}, r"data\.result\[0\]\.values\[1\]: '2e6' is not a GPU count \(at most")
    csv = tmp_path / "demand.csv"
    csv.write_text("ts,gpus\n2023-04-26T00:00:00Z,3\n2023-04-26T00:10:00Z,1e90\n")
    _refused(csv, {"format": "csv", "value_col": "gpus"}, r"line 3, column 'gpus': value 1e\+90 is beyond 1,000,000 GPUs")


@pytest.mark.parametrize("gpus", ["1_0", "\u0663", "\uff14", "+4", "4.0"])
def test_a_tres_gpu_count_is_ascii_digits_only(tmp_path, gpus):
    """Python's int() takes '1_0' (10), an Arabic-Indic or a full-width digit, a sign: sacct writes none."""
    path = tmp_path / "jobs.txt"
    path.write_text(SACCT_HEAD + _sacct_row(gpus=gpus))
    _refused(path, {"format": "sacct"}, r"line 2, column AllocTRES: 'gres/gpu=.*' is not a whole GPU count$")


@pytest.mark.parametrize("value", ["1_0", "\u0663"])
def test_a_prometheus_value_is_ascii_only(tmp_path, value):
    answer = tmp_path / "a.json"
    answer.write_text(_prom([[1682467200, value]]))
    _refused(answer, {"format": "prometheus"}, r"data\.result\[0\]\.values\[0\]: .* is not \[time, \"value\"\]")


def test_a_repeated_job_or_pod_is_refused_and_job_steps_ids_reused_and_namespaces_are_not_repeats(tmp_path):
    path = tmp_path / "jobs.txt"
    path.write_text(SACCT_HEAD + _sacct_row() + _sacct_row("2", "1") + _sacct_row())  # 8 GPU-h listed twice
    _refused(path, {"format": "sacct"}, r"line 4: job '1' submitted '2023-04-26T00:00:00' repeats line 2; a job counts "
                                        "once")
    # a repeat in a partition left out is still a repeat
    path.write_text(SACCT_HEAD + _sacct_row(partition="cpu") + _sacct_row(partition="cpu"))
    _refused(path, {"format": "sacct", "partition": "gpu"}, r"line 3: job '1' .* repeats line 2")
    # what sacct writes: steps (without --allocations) beside their job, an id reused with another Submit (a
    # requeue or a reset counter), the same id on two clusters: each job once
    path.write_text("JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition|Cluster\n"
                    "1|2023-04-26T00:00:00|2023-04-26T01:00:00|2023-04-26T02:00:00|COMPLETED|gres/gpu=4|gres/gpu=4|gpu|a\n"
                    "1.batch|2023-04-26T01:00:00|2023-04-26T01:00:00|2023-04-26T02:00:00|COMPLETED|gres/gpu=4||gpu|a\n"
                    "1.0|2023-04-26T01:00:00|2023-04-26T01:00:00|2023-04-26T02:00:00|COMPLETED|gres/gpu=4||gpu|a\n"
                    "1|2023-04-26T03:00:00|2023-04-26T03:00:00|2023-04-26T04:00:00|COMPLETED|gres/gpu=2|gres/gpu=2|gpu|a\n"
                    "1|2023-04-26T00:00:00|2023-04-26T01:00:00|2023-04-26T02:00:00|COMPLETED|gres/gpu=1|gres/gpu=1|gpu|b\n")
    got = read_history(HistorySpec(format="sacct", path=path), pd.Timedelta("1h"), START, END)
    assert list(got["pending"]) == [5, 0, 0, 0, 0, 0, 0, 0] and list(got["running"]) == [0, 5, 0, 2, 0, 0, 0, 0]
    pods = tmp_path / "pods.csv"
    pods.write_text(POD_HEAD + "a,0,10,7200,1,1000\nb,0,10,7200,1,1000\na,0,10,7200,1,1000\n")
    _refused(pods, {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
             r"line 4: pod 'a' created '0' repeats line 2; a pod counts once")
    # a name used again later, and one name in two namespaces, are different pods
    pods.write_text("namespace," + POD_HEAD + "x,a,0,0,3600,2,1000\nx,a,3600,3600,7200,2,1000\ny,a,0,0,3600,2,1000\n")
    got = read_history(HistorySpec(format="pods", path=pods, origin=START), pd.Timedelta("1h"), START, END)
    assert list(got["running"][:3]) == [4, 2, 0]


def test_a_job_across_the_fall_back_is_read_in_the_order_of_its_times(tmp_path):
    """Berlin's clocks went from 03:00 back to 02:00 on 2023-10-29: 02:00-03:00 happened twice."""
    path = tmp_path / "jobs.txt"
    path.write_text(SACCT_HEAD
                    # submitted and started in the first 02:xx (CEST), ended in the second (CET): 20 minutes
                    + _sacct_row("1", "4", "2023-10-29T02:40:00", "2023-10-29T02:50:00", "2023-10-29T02:10:00")
                    # wholly inside the repeated hour: either reading orders it, the daylight-saving one is taken
                    + _sacct_row("2", "2", "2023-10-29T02:05:00", "2023-10-29T02:10:00", "2023-10-29T02:40:00")
                    # submitted before the hour (CEST), started in it: the order cannot tell, daylight-saving
                    + _sacct_row("3", "1", "2023-10-29T01:55:00", "2023-10-29T02:30:00", "2023-10-29T04:00:00"))
    start, end = pd.Timestamp("2023-10-28T23:00:00Z"), pd.Timestamp("2023-10-29T04:00:00Z")
    got = read_history(HistorySpec(format="sacct", path=path, timezone="Europe/Berlin"), pd.Timedelta("5min"),
                       start, end)
    minute = dt.timedelta(minutes=1)

    def z(text):
        return pd.Timestamp(text)

    running = [(z("2023-10-29T00:50Z"), z("2023-10-29T01:10Z"), 4), (z("2023-10-29T00:10Z"), z("2023-10-29T00:40Z"), 2),
               (z("2023-10-29T00:30Z"), z("2023-10-29T03:00Z"), 1)]
    pending = [(z("2023-10-29T00:40Z"), z("2023-10-29T00:50Z"), 4), (z("2023-10-29T00:05Z"), z("2023-10-29T00:10Z"), 2),
               (z("2023-10-28T23:55Z"), z("2023-10-29T00:30Z"), 1)]
    grid = pd.date_range(start, end, freq="5min", inclusive="left")

    def per_step(boxes):
        return np.array([np.mean([_level(boxes, t) for t in pd.date_range(t0, t0 + pd.Timedelta("5min"), freq=minute,
                                                                          inclusive="left")]) for t0 in grid])

    np.testing.assert_allclose(got["running"], per_step(running), atol=1e-9)
    np.testing.assert_allclose(got["pending"], per_step(pending), atol=1e-9)
    # a job no reading orders is still refused
    path.write_text(SACCT_HEAD + _sacct_row("4", "1", "2023-10-29T01:00:00", "2023-10-29T03:30:00",
                                            "2023-10-29T02:10:00"))
    with pytest.raises(HistoryError, match=r"line 2: End 2023-10-29 00:10:00\+00:00 is before Start 2023-10-29 02:30"):
        read_history(HistorySpec(format="sacct", path=path, timezone="Europe/Berlin"), pd.Timedelta("5min"), start, end)
    # a pod list's naive times are settled alike
    pods = tmp_path / "pods.csv"
    pods.write_text(POD_HEAD + "a,2023-10-29T02:40:00,2023-10-29T02:50:00,2023-10-29T02:10:00,4,1000\n")
    got = read_history(HistorySpec(format="pods", path=pods, timezone="Europe/Berlin"), pd.Timedelta("5min"),
                       start, end)
    np.testing.assert_allclose(got["running"], per_step(running[:1]), atol=1e-9)


@pytest.mark.parametrize("name, text, spec, match", [
    ("pods.csv", POD_HEAD + "a,0,10,7200,1,1000\n", {"format": "pods", "origin": "9999-12-31T00:00:00Z"},
     r"line 2, column creation_time: '0' seconds from origin is 9999-12-31T00:00:00\+00:00, outside the times a "
     r"history may name \(1970-01-01 \.\. 2200-01-01\)"),
    ("pods.csv", POD_HEAD + "a,0,10,1e11,1,1000\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"line 2, column deletion_time: '1e11' seconds from origin is 5192-.*, outside the times"),
    ("pods.csv", POD_HEAD + "a,2023-04-26T00:00:00Z,2023-04-26T00:01:00Z,9999-12-01T00:00:00,1,1000\n",
     {"format": "pods"}, r"line 2, column deletion_time: 9999-12-01T00:00:00\+00:00 is outside the times"),
    ("jobs.txt", SACCT_HEAD + _sacct_row(end="2300-01-01T00:00:00"), {"format": "sacct"},
     r"line 2, column End: 2300-01-01T00:00:00\+00:00 is outside the times a history may name"),
    ("jobs.txt", SACCT_HEAD + _sacct_row(submit="1969-12-31T23:00:00"), {"format": "sacct"},
     r"line 2, column Submit: 1969-12-31T23:00:00\+00:00 is outside"),
    ("a.json", _prom([[1e15, "1"]]), {"format": "prometheus"},
     r"values\[0\]: time 1000000000000000\.0 is after the year 9999, outside the times"),
    ("a.json", _prom([["NaN", "1"], [1682467200, "2"]]), {"format": "prometheus"},
     r"values\[0\]: time 'NaN' is not a time"),
    ("demand.csv", "ts,gpus\n2023-04-26T00:00:00,3\n-0001-01-01T00:00:00,3\n", {"format": "csv", "time_col": "ts"},
     r"line 3, column 'ts': -001-01-01T00:00:00\+00:00 is outside the times"),
    ("demand.csv", "ts,gpus\n2023-04-26T00:00:00Z,a\n2023-04-26T00:10:00Z,b\n", {"format": "csv", "value_col": "gpus"},
     r"column 'gpus': no number in its 2 rows"),
    ("a.json", _prom([[1682467200, "NaN"], [1682467260, "NaN"]]), {"format": "prometheus"},
     r"every value is NaN"),
])
def test_times_and_values_that_are_no_history_are_refused_saying_what(tmp_path, name, text, spec, match):
    path = tmp_path / name
    path.write_text(text)
    _refused(path, spec, match)


def test_a_byte_order_mark_is_no_part_of_the_header(tmp_path):
    plain = read_history(HistorySpec(format="sacct", path=FIX / "jobs.txt"), pd.Timedelta("5min"), START, END)
    path = tmp_path / "jobs.txt"
    path.write_bytes(b"\xef\xbb\xbf" + (FIX / "jobs.txt").read_bytes())
    pd.testing.assert_frame_equal(read_history(HistorySpec(format="sacct", path=path), pd.Timedelta("5min"),
                                               START, END), plain)
    answer = tmp_path / "a.json"
    answer.write_bytes(b"\xef\xbb\xbf" + (FIX / "prom_allocated.json").read_bytes())
    pd.testing.assert_frame_equal(
        read_history(HistorySpec(format="prometheus", allocated=answer), pd.Timedelta("5min"), START, END),
        read_history(HistorySpec(format="prometheus", allocated=FIX / "prom_allocated.json"), pd.Timedelta("5min"),
                     START, END))


@pytest.mark.parametrize("text, spec, match", [
    (SACCT_HEAD, {"format": "sacct"}, r"no jobs: no rows below the header"),
    (SACCT_HEAD + "1.batch|2023-04-26T00:00:00|2023-04-26T00:00:00|2023-04-26T01:00:00|COMPLETED|gres/gpu=1||\n"
     + _sacct_row("2", "0") + _sacct_row("3", "2", partition="debug"), {"format": "sacct", "partition": "gpu"},
     r"no usable jobs in 3 rows \(job steps: 1, in other partitions: 1, without GPUs: 1\)"),
    (POD_HEAD + "a,0,10,7200,0,0\n", {"format": "pods", "origin": "2023-04-26T00:00:00Z"},
     r"no usable pods in 1 row \(without GPUs: 1\)"),
    (_prom([]), {"format": "prometheus"}, r"no samples"),
])
def test_a_log_without_usable_jobs_says_why_when_its_span_is_asked(tmp_path, text, spec, match):
    from gpupool.sim.history import history_span

    path = tmp_path / "log"
    path.write_text(text)
    key = "allocated" if spec["format"] == "prometheus" else "path"
    with pytest.raises(HistoryError, match=rf"^{path}: {match}, so nothing to take the what-if's window from$"):
        history_span(HistorySpec(**spec, **{key: path}))
