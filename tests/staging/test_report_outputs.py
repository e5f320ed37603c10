"""`gpupool report --out DIR` never overwrites what it did not write and never leaves half a
report: a directory gpupool did not write is refused, a link inside one it did is never
followed, a directory no file can be made in is refused before staging is read, a failure
leaves the directory as it was; the what-if replays a platform that missed an hour; and the
report's work follows the data staging holds, not the window asked."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from gpupool import report
from gpupool.cli import main
from gpupool.staging import db, loader

START = datetime(2026, 11, 1, tzinfo=timezone.utc)
HOURS = 3
WINDOW = ("--start", START.isoformat(), "--end", (START + timedelta(hours=HOURS)).isoformat())


def _stage(engine, missing_last_hour: str | None = None) -> None:
    """Three hours of two platforms' totals every 5 minutes; ``missing_last_hour`` names a
    platform whose last hour is missing (its exporter was down)."""
    end = START + timedelta(hours=HOURS)
    for p in ("slurm", "kubernetes"):
        ts = pd.date_range(START, end, freq="5min", inclusive="left")
        if p == missing_last_hour:
            ts = ts[ts < end - timedelta(hours=1)]
        rows = pd.concat([pd.DataFrame({"metric": m, "ts": ts, "value": v}) for m, v in
                          (("gpu_allocated", 20.0 if p == "slurm" else 30.0), ("gpu_pending", 1.0),
                           ("gpu_capacity", 32.0))], ignore_index=True).assign(
            platform=p, cluster="", entity_kind="platform", entity_id="", unit="gpus")
        loader.replace_slice(engine, loader.Slice("sample", {"platform": p}, START, end), rows)


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """An SQLite staging the CLI is pointed at, with the engine to fill it."""
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_GPUPOOL_STAGING", raising=False)
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    engine = db.make_engine(url)
    db.upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def folder(tmp_path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


def _state(folder: Path) -> dict[str, str]:
    """Every entry under folder: a link as its target, a file as its content's hash."""
    state = {}
    for p in sorted(folder.rglob("*")):
        mode = os.lstat(p).st_mode
        key = str(p.relative_to(folder))
        state[key] = ("link->" + os.readlink(p) if stat.S_ISLNK(mode)
                      else hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(mode) else "dir")
    return state


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(capsys, folder: Path, *argv: str, needles: tuple[str, ...] = ()) -> str:
    before = _state(folder)
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert _state(folder) == before
    return lines[0]


@pytest.fixture
def no_staging_read(monkeypatch):
    """Fail the test if the report reads staging: a refused --out must be refused before."""
    def read(*a, **k):
        raise AssertionError("staging was read before --out was checked")

    monkeypatch.setattr(report.reads, "platform_series", read)


# --- the directory --------------------------------------------------------------------------


def test_a_directory_gpupool_did_not_write_is_refused(capsys, staging, folder, no_staging_read):
    """Its index.html and CSVs were overwritten."""
    mine = folder / "site"
    mine.mkdir()
    (mine / "index.html").write_text("<p>my own page</p>")
    (mine / "demand_hourly.csv").write_text("mine\n")
    _refused(capsys, folder, "report", *WINDOW, "--out", str(mine), needles=("--out", "site", "did not write"))


def test_a_link_to_a_directory_is_refused(capsys, staging, folder, no_staging_read):
    (folder / "real").mkdir()
    (folder / "link").symlink_to("real")
    _refused(capsys, folder, "report", *WINDOW, "--out", str(folder / "link"), needles=("--out", "symbolic link"))


def test_a_directory_no_file_can_be_made_in_is_refused_before_staging_is_read(capsys, staging, folder,
                                                                               no_staging_read):
    """/proc takes no new entry, even from root: found only after the whole report before."""
    _refused(capsys, folder, "report", *WINDOW, "--out", "/proc/gpupool-report",
             needles=("--out", "/proc", "not writable"))


def test_a_link_planted_in_a_report_is_never_followed(capsys, staging, folder):
    """A report's own directory is replaced whole on the next report; a link planted in it (to a
    file elsewhere) was written through: the file elsewhere got the report's page."""
    _stage(staging)
    out = folder / "report"
    rc, _, err = _cli(capsys, "report", *WINDOW, "--out", str(out), "--no-whatif")
    assert rc == 0, err
    assert json.loads((out / report.MARKER).read_text())["entries"]
    elsewhere = folder / "elsewhere.html"
    elsewhere.write_text("not the report's")
    (out / "index.html").unlink()
    (out / "index.html").symlink_to(elsewhere)
    (out / "demand_hourly.csv").unlink()
    (out / "demand_hourly.csv").symlink_to(elsewhere)
    rc, _, err = _cli(capsys, "report", *WINDOW, "--out", str(out), "--no-whatif")
    assert rc == 0, err
    assert elsewhere.read_text() == "not the report's"
    assert not (out / "index.html").is_symlink() and "gpupool report" in (out / "index.html").read_text()
    assert not (out / "demand_hourly.csv").is_symlink()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [report.MARKER]  # no build left
    # a file a user put in it since: the report's directory is no longer only the report's
    (out / "notes.txt").write_text("mine")
    _refused(capsys, folder, "report", *WINDOW, "--out", str(out), "--no-whatif",
             needles=("--out", "'notes.txt'", "no gpupool report wrote"))


def test_a_failed_report_leaves_the_directory_as_it_was(staging, folder, monkeypatch):
    """A failure after the first files (here in the what-if) left a directory without index.html."""
    import gpupool.sim.study as sim_study

    _stage(staging)
    end = START + timedelta(hours=HOURS)

    def broken(*a, **k):
        raise RuntimeError("the what-if failed")

    monkeypatch.setattr(sim_study, "simulate", broken)
    with pytest.raises(RuntimeError):
        report.write_report(staging, START, end, folder / "new")
    assert sorted(os.listdir(folder)) == []  # no report, not half of one, no build left
    report.write_report(staging, START, end, folder / "old", whatif=False)
    before = _state(folder)
    with pytest.raises(RuntimeError):
        report.write_report(staging, START, end, folder / "old")
    assert _state(folder) == before  # the previous report whole


# --- what it reports --------------------------------------------------------------------------


def test_the_what_if_replays_a_platform_that_missed_an_hour(capsys, staging, folder):
    """One platform's last hour missing: the what-if refused its traces' different spans, the
    report failed and left a directory without index.html."""
    _stage(staging, missing_last_hour="kubernetes")
    out = folder / "report"
    rc, _, err = _cli(capsys, "report", *WINDOW, "--out", str(out))
    assert rc == 0, err
    table = json.loads((out / "whatif.json").read_text())
    assert {r["policy"] for r in table} >= {"static", "reactive", "predictive"}
    traces = {p: pd.read_csv(out / "traces" / f"{p}.csv") for p in ("slurm", "kubernetes")}
    assert list(traces["slurm"]["time"]) == list(traces["kubernetes"]["time"])  # one grid
    assert (traces["kubernetes"]["running_gpu_num"] == 30.0).all()  # the missed hour carries its values
    page = (out / "index.html").read_text()
    assert "kubernetes has no sample for 12 of the replay&#x27;s 36 steps" in page


def test_the_reports_work_follows_the_data_not_the_window(capsys, staging, folder, monkeypatch):
    """Ten years asked over three hours of data: a replayed forecast for each of the 87,600
    hours (97 s). Only the hours staging holds data for are worked on, and the page says so."""
    import gpupool.forecast.stage as stage

    hours_asked = []
    real = stage.one_hour_ahead

    def counted(history, hours, *a, **k):
        hours_asked.append(len(hours))
        if len(hours) > 24:  # fail at once rather than replay ten years
            raise AssertionError(f"{len(hours)} hours replayed for {HOURS} hours of data")
        return real(history, hours, *a, **k)

    monkeypatch.setattr(stage, "one_hour_ahead", counted)
    _stage(staging)
    out = folder / "report"
    rc, _, err = _cli(capsys, "report", "--start", START.isoformat(), "--end", "2036-11-01T00:00Z",
                      "--out", str(out), "--no-whatif")
    assert rc == 0, err
    assert hours_asked == [HOURS, HOURS]  # per platform, the hours with data
    fc = pd.read_csv(out / "forecast_hourly.csv", parse_dates=["ts"])
    assert fc["ts"].max() < pd.Timestamp(START + timedelta(hours=HOURS))
    page = (out / "index.html").read_text()
    assert ("Window asked: 2026-11-01T00:00:00+00:00 – 2036-11-01T00:00:00+00:00; staging holds samples only for "
            "2026-11-01T00:00:00+00:00 – 2026-11-01T03:00:00+00:00, which this report covers") in page
