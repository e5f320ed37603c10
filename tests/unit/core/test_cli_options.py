"""The CLI's options are checked before anything is touched: a bad one is exit 2 and one line
that echoes at most a short, escaped prefix of the value, and staging is left as it was (not
even created). What the CLI prints never sends a control character to the terminal, a closed
pipe ends it quietly, and a normal run prints nothing on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool.cli import main

ROOT = Path(__file__).resolve().parents[3]
ESC = "evil\x1b]0;pwned\x07\x1b[31m"


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as done:
        rc = done.code
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(capsys, *argv: str, needles: tuple[str, ...] = ()) -> str:
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupool"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "\x1b" not in err and "\x07" not in err
    return lines[0]


def _tables(path: Path) -> list[str]:
    if not path.exists():
        return []
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        return sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()


@pytest.fixture
def staging(tmp_path, monkeypatch) -> Path:
    """An empty staging file's path (not created yet), named by GPUPOOL_STAGING_URL."""
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_GPUPOOL_STAGING", raising=False)
    path = tmp_path / "staging.db"
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{path}")
    return path


@pytest.fixture
def upgraded(staging, capsys) -> Path:
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    return staging


# --- times -------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["", "garbage", "-1"])
def test_fastpath_at_is_checked_before_staging_is_touched(capsys, staging, at):
    """`--at ""` ran a tick on the wall clock; `--at garbage` created staging's tables first."""
    _refused(capsys, "fastpath", f"--at={at}", needles=("--at", repr(at), "not a time"))
    assert _tables(staging) == []


@pytest.mark.parametrize("argv", [
    ("fastpath", "--at=-1"),
    ("plan", "--at=-1"),
    ("summary", "--start=-1", "--end", "2026-11-01T01:00Z"),
    ("summary", "--start", "2026-11-01T00:00Z", "--end=-1"),
    ("metrics", "serve", "--at=-1"),
    ("nvml", "push", "--platform", "slurm", "--node", "gpu-n001", "--at=-1"),
    ("forecast", "--platform", "slurm", "--at=-1", "--horizon", "3"),
], ids=["fastpath", "plan", "summary-start", "summary-end", "metrics-serve", "nvml-push", "forecast"])
def test_a_time_of_minus_one_is_one_line(capsys, staging, argv):
    """Year -1 parses as a pandas time and then failed as a datetime, with a traceback."""
    option = next(a.split("=")[0] for a in argv if a.endswith("=-1"))
    _refused(capsys, *argv, needles=(option, "'-1'", "not a time"))
    assert _tables(staging) == []


def test_a_time_far_out_of_range_names_the_bounds(capsys, staging):
    _refused(capsys, "summary", "--start", "0001-01-01", "--end", "2026-11-01", needles=("--start", "1970-01-01"))


# --- the what-if's step and move time ----------------------------------------------------------


@pytest.fixture
def history(tmp_path) -> str:
    ts = pd.date_range("2026-01-01", periods=300, freq="5min")
    pd.DataFrame({"ts": ts.strftime("%Y-%m-%dT%H:%M:%S"), "v": 10 + np.arange(300) % 7}).to_csv(
        tmp_path / "h.csv", index=False)
    return f"csv:{tmp_path / 'h.csv'},time_col=ts,value_col=v"


@pytest.mark.parametrize("option, value, needle", [
    ("--step", "0s", "positive duration"),
    ("--step", "0min", "positive duration"),
    ("--move-minutes", "inf", "from 0 to"),
    ("--move-minutes", "1e300", "from 0 to"),
    ("--move-minutes", "nan", "from 0 to"),
])
def test_whatif_step_and_move_minutes(capsys, history, monkeypatch, option, value, needle):
    import gpupool.sim.study as study

    monkeypatch.setattr(study, "simulate", lambda *a, **k: pytest.fail("the what-if ran"))
    _refused(capsys, "whatif", "--slurm", history, "--slurm-nodes", "4", "--no-progress", f"{option}={value}",
             needles=(option, needle))


@pytest.mark.parametrize("argv, needles", [
    (("--owns", "gpu=1"), ("--owns 'gpu=1'", "no platform 'gpu'", "slurm, kubernetes, openstack")),
    (("--lend-limit", "openstack=1"), ("--lend-limit 'openstack=1'", "without --openstack")),
    (("--borrow-limit", "slurm=-1"), ("--borrow-limit 'slurm=-1'", "give 0 or more")),
    (("--owns", "slurm=1.5"), ("--owns 'slurm=1.5'", "not a whole number")),
    (("--reclaim-minutes", "soon"), ("--reclaim-minutes 'soon'", "not a number of minutes")),
    (("--reclaim-minutes", "0"), ("--reclaim-minutes '0'", "above 0")),
    (("--min-runtime-minutes", "nan"), ("--min-runtime-minutes 'nan'", "from 0")),
    (("--min-runtime-minutes", "slurm=1e9"), ("--min-runtime-minutes 'slurm=1e9'", "up to 527040")),
    (("--owns", "slurm=1", "--owns", "slurm=2"), ("--owns 'slurm=2'", "owns of slurm is given twice")),
    (("--reclaim-minutes", "30", "--reclaim-minutes", "45"), ("'45'", "reclaim_minutes of every platform is given twice")),
    (("--owns", f"{ESC}=1"), ("--owns", "no platform")),
], ids=["unknown-platform", "not-in-study", "negative", "fraction", "not-a-number", "zero-reclaim", "nan",
        "beyond-a-year", "twice", "bare-twice", "escape"])
def test_whatif_ownership_options(capsys, history, monkeypatch, argv, needles):
    """A bad ownership option is one line naming the option and the value, before the what-if runs."""
    import gpupool.sim.study as study

    monkeypatch.setattr(study, "simulate", lambda *a, **k: pytest.fail("the what-if ran"))
    _refused(capsys, "whatif", "--slurm", history, "--slurm-nodes", "4", "--no-progress", *argv, needles=needles)


def test_a_scenario_with_an_infinite_move_time(capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("move_minutes: .inf\nstart: 2026-01-01\nend: 2026-01-02\nplatforms:\n  slurm: {nodes: 2}\n")
    _refused(capsys, "simulate", str(path), "--no-progress", needles=("move_minutes",))


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ("run", "--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z", "--platform"),
    ("extract", "--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z", "--platform"),
    ("forecast", "--at", "2026-11-01T01:00Z", "--platform"),
    ("nvml", "push", "--node", "gpu-n001", "--platform"),
], ids=["run", "extract", "forecast", "nvml-push"])
def test_a_huge_platform_name_is_echoed_as_a_short_prefix(capsys, staging, argv):
    line = _refused(capsys, *argv, "p" * 100_000, needles=("--platform", "'pppp", "not a platform name"))
    assert len(line) < 300
    assert _tables(staging) == []


def test_a_platform_name_with_a_terminal_escape(capsys, staging):
    _refused(capsys, "extract", "--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z", "--platform", ESC,
             needles=("--platform", "\\x1b"))


@pytest.mark.parametrize("command", ["push", "serve"])
def test_a_node_name_with_a_terminal_escape_is_refused(capsys, staging, command):
    _refused(capsys, "nvml", command, "--platform", "slurm", "--node", ESC, needles=("--node", "\\x1b", "printable"))
    assert _tables(staging) == []


def test_handovers_show_control_characters_escaped(capsys, upgraded):
    """A node name comes from a platform's API: `handovers` printed it raw to the terminal."""
    from gpupool.actuation import handover as ho
    from gpupool.staging import db
    from gpupool.staging import fastpath as store

    engine = db.make_engine()
    at = datetime(2026, 11, 1, 1, tzinfo=timezone.utc)
    hid = ho.open_handover(engine, ESC, "kubernetes", "slurm", at, reason="burst")
    store.record_decisions(engine, at, [{"platform": "slurm", "node": ESC, "source": "kubernetes", "target": "slurm",
                                         "reason": f"short; {ESC} idle", "dry_run": True, "handover_id": hid}])
    engine.dispose()
    rc, out, err = _cli(capsys, "handovers")
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert out.count("evil\\x1b]0;pwned\\x07\\x1b[31m") == 3  # the table, the move, and its reason


# --- staging URLs ------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "postgresql://gpupool:Sup3rS3cretFAKE@db.example:five432/staging",
    "postgresql+asyncpg://gpupool:Sup3rS3cretFAKE@db.example:5432/staging",
    "postgresql+psycopg_async://gpupool:Sup3rS3cretFAKE@db.example:5432/staging",
    "sqlite+aiosqlite:///{tmp}/staging.db",
], ids=["port-not-a-number", "asyncpg", "psycopg-async", "aiosqlite"])
@pytest.mark.parametrize("given", ["env", "option"])
def test_an_unusable_staging_url_is_one_line(capsys, tmp_path, monkeypatch, url, given):
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    url = url.format(tmp=tmp_path)
    if given == "env":
        monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
        argv, where = ("handovers",), "GPUPOOL_STAGING_URL"
    else:
        monkeypatch.delenv("GPUPOOL_STAGING_URL", raising=False)
        argv, where = ("handovers", "--staging-url", url), "the staging URL given"
    line = _refused(capsys, *argv, needles=("staging URL", where))
    for part in ("Sup3rS3cretFAKE", "db.example", "five432", "asyncpg", "aiosqlite", str(tmp_path)):
        assert part not in line, part


# --- pipes and stderr --------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONPATH": str(ROOT / "include")}
    env.pop("GPUPOOL_CONFIG", None)
    return env


def test_a_closed_pipe_ends_quietly(upgraded):
    """`gpupool handovers | head -1`: a BrokenPipeError traceback, or Python's report of one at exit."""
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli", "handovers"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(GPUPOOL_STAGING_URL=f"sqlite:///{upgraded}"))
    proc.stdout.close()  # the reader is gone before the first line is written
    _, err = proc.communicate(timeout=120)
    assert err.decode() == "" and proc.returncode == 1, err.decode()


@pytest.fixture
def series_csv(tmp_path) -> Path:
    ts = pd.date_range("2026-01-01", periods=200, freq="h")
    rng = np.random.default_rng(0)
    v = 10 + 3 * np.sin(np.arange(200) / 24 * 2 * np.pi) + rng.normal(0, 0.2, 200)
    v[120] = 40.0
    pd.DataFrame({"ts": ts.strftime("%Y-%m-%dT%H:%M:%S"), "v": v}).to_csv(tmp_path / "s.csv", index=False)
    return tmp_path / "s.csv"


@pytest.mark.parametrize("argv", [
    ("detect", "{csv}", "--out", "{dir}/d.csv"),
    ("detect", "{csv}", "--out", "{dir}/p.csv", "--detector", "prophet"),
    ("forecast", "{csv}", "--horizon", "5", "--out", "{dir}/f.csv"),
], ids=["detect", "detect-prophet", "forecast"])
def test_a_normal_run_prints_nothing_on_stderr(series_csv, argv):
    """Was plotly's "Importing plotly failed" and cmdstanpy's INFO lines on every Prophet fit."""
    argv = [a.format(csv=series_csv, dir=series_csv.parent) for a in argv]
    done = subprocess.run([sys.executable, "-m", "gpupool.cli", *argv], capture_output=True, text=True,
                          env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_gpupools_own_warnings_still_reach_stderr(series_csv):
    code = (
        "import logging, pandas as pd\n"
        "from gpupool.detect.prophet import ProphetDetector\n"
        f"y = pd.read_csv({str(series_csv)!r}, index_col=0, parse_dates=True)['v']\n"
        "ProphetDetector().fit(y)\n"
        "logging.getLogger('gpupool.pipeline').warning('a warning of gpupool')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "a warning of gpupool\n"


@pytest.mark.slow
def test_a_days_pipeline_run_prints_nothing_on_stderr(staging):
    """A day of the embedded datacenter routes some series to Prophet."""
    done = subprocess.run([sys.executable, "-m", "gpupool.cli", "run", "--start", "2026-11-01T00:00Z", "--end",
                           "2026-11-02T00:00Z"], capture_output=True, text=True, timeout=600,
                          env=_env(GPUPOOL_STAGING_URL=f"sqlite:///{staging}"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
