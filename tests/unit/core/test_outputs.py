"""Outputs never replace what they do not own: every file option of the CLI (`detect --out`,
`forecast --out/--summary-json`, `simulate --json`, `whatif --json/--scenario-out`,
`run --json`) writes through a special file (a character device, a FIFO with a reader, a path
naming an open descriptor) and never replaces it; refuses a symbolic link to a regular file or
to nothing, a FIFO no process reads, a socket, and a directory no file can be made in, in one
line with exit 2, before the work, leaving every file it did not create as it was.

The device files used are reached through links made here (``out.json -> /dev/null``) and
descriptors through ``/dev/fd/N`` (under /proc): code that replaced them would replace the link
or fail, never a file of the system, even run as root."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import gpupool
from gpupool.cli import main

INCLUDE = str(Path(gpupool.__file__).resolve().parents[1])  # the package under test, in a subprocess too
#: what the faked simulation returns: the output options are what is tested, not the study
RESULT = {"total": {"unmet_gpu_hours": 1.5, "moves": 2}}


# --- helpers ---------------------------------------------------------------------------------


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as done:
        rc = done.code
    out, err = capsys.readouterr()
    return rc, out, err


def _state(folder: Path) -> dict[str, str]:
    """Every entry under folder, hidden ones included: a link as its target, a special file as
    its kind, a file as its content's hash."""
    state = {}
    for p in sorted(folder.rglob("*")):
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            state[str(p.relative_to(folder))] = "link->" + os.readlink(p)
        elif stat.S_ISREG(mode):
            state[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            state[str(p.relative_to(folder))] = stat.filemode(mode)[0]
    return state


def _refused(capsys, folder: Path, *argv: str, needles: tuple[str, ...] = ()) -> str:
    before = _state(folder)
    started = time.monotonic()
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2, (rc, out, err)
    assert time.monotonic() - started < 60  # answered, not hung (the bar itself is checked by hand)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert _state(folder) == before  # inputs untouched, nothing written, no temporary left
    return lines[0]


def _helios(path: Path, level: float) -> Path:
    ts = pd.date_range("2024-01-01", periods=288, freq="5min")
    pd.DataFrame({"time": ts.strftime("%Y-%m-%d %H:%M:%S"), "running_gpu_num": level,
                  "pending_gpu_num": 0.0, "total_gpu_num": 32.0}).to_csv(path, index=False)
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    ts = pd.date_range("2026-01-01", periods=120, freq="h")
    values = 10 + 3 * np.sin(np.arange(120) / 24 * 2 * np.pi)
    pd.DataFrame({"ts": ts.strftime("%Y-%m-%dT%H:%M:%S"), "v": values}).to_csv(folder / "good.csv", index=False)
    _helios(folder / "a.csv", 10.0)
    _helios(folder / "b.csv", 12.0)
    (folder / "trace.yaml").write_text("move_minutes: 30\nplatforms:\n  slurm: {trace: [a.csv]}\n"
                                       "  kubernetes: {trace: [b.csv]}\n")
    return folder


@pytest.fixture
def fake_study(monkeypatch):
    """A simulation that returns RESULT at once."""
    import gpupool.sim.study as sim_study

    monkeypatch.setattr(sim_study, "simulate", lambda *a, **k: RESULT)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the work starts: a refused output must be refused before it."""
    import gpupool.detect.io as detect_io
    import gpupool.forecast.io as forecast_io
    import gpupool.pipeline as pipeline
    import gpupool.sim.study as sim_study
    import gpupool.sim.whatif as sim_whatif

    def work(*a, **k):
        raise AssertionError("the work started before the output was checked")

    for module, name in ((sim_study, "simulate"), (detect_io, "stream_detect"), (forecast_io, "AutoForecaster"),
                         (pipeline, "run_window"), (sim_whatif, "whatif_scenario")):
        monkeypatch.setattr(module, name, work)


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """`gpupool run` on an empty SQLite staging, its pipeline pass faked."""
    import gpupool.pipeline as pipeline

    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    monkeypatch.setattr(pipeline, "run_window", lambda *a, **k: {"platforms": ["slurm"], "rows": 3})


#: each output option: (command line with {out} for the output, what it writes there)
COMMANDS = {
    "detect": (["detect", "{data}/good.csv", "--out", "{out}"], "timestamp,value,expected"),
    "forecast": (["forecast", "{data}/good.csv", "--horizon", "3", "--out", "{out}"], "step,timestamp,yhat"),
    "forecast-summary": (["forecast", "{data}/good.csv", "--horizon", "3", "--out", "{data}/fc.csv",
                          "--summary-json", "{out}"], '"horizon": 3'),
    "simulate": (["simulate", "{data}/trace.yaml", "--no-progress", "--json", "{out}"], '"unmet_gpu_hours": 1.5'),
    "whatif": (["whatif", "--slurm", "{data}/a.csv", "--slurm-nodes", "4", "--no-progress", "--json", "{out}"],
               '"unmet_gpu_hours": 1.5'),
    "whatif-scenario": (["whatif", "--slurm", "{data}/a.csv", "--slurm-nodes", "4", "--no-progress",
                         "--scenario-out", "{out}"], "platforms:"),
    "run": (["run", "--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z", "--json", "{out}"], '"rows": 3'),
}


def _argv(command: str, data: Path, out: str | Path) -> list[str]:
    return [a.format(data=data, out=out) for a in COMMANDS[command][0]]


# --- special files are written through, never replaced ---------------------------------------


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_link_to_a_device_is_written_through_not_replaced(capsys, data, fake_study, fake_run, command):
    """`--json /dev/null` replaced the device with a regular file (run as root, the system's own);
    here through a link to it, which the old code replaced instead."""
    link = data / "out.link"
    link.symlink_to("/dev/null")
    rc, out, err = _cli(capsys, *_argv(command, data, link))
    assert rc == 0, err
    assert os.readlink(link) == "/dev/null" and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not [p.name for p in data.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("command", ["detect", "simulate", "whatif", "run"])
def test_a_fifo_with_a_reader_gets_the_output(capsys, data, fake_study, fake_run, command):
    fifo = data / "out.fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        time.sleep(0.2)  # the reader waits in its open
        rc, out, err = _cli(capsys, *_argv(command, data, fifo))
        assert rc == 0, err
        got, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
    assert COMMANDS[command][1] in got.decode()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("command", ["detect", "forecast", "simulate", "whatif", "run"])
def test_a_fifo_nobody_reads_is_refused_at_once(capsys, data, fake_run, no_work, command):
    """The open would wait for a reader forever (or the old code replaced the FIFO)."""
    fifo = data / "out.fifo"
    os.mkfifo(fifo)
    _refused(capsys, data, *_argv(command, data, fifo), needles=(str(fifo), "FIFO", "no process reads"))


def test_a_path_naming_a_descriptor_is_written_through(data, tmp_path):
    """`--json /dev/stdout | jq` and `--out /dev/fd/3`: the output goes down the descriptor; a file
    a descriptor names (a shell's `>>`) is appended to, never replaced."""
    env = {**os.environ, "PYTHONPATH": INCLUDE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("GPUPOOL_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "gpupool.cli", "detect", str(data / "good.csv"), "--out", "/dev/fd/1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("timestamp,value,expected") and '"rows": 120' in done.stdout
    kept = tmp_path / "appended.csv"
    kept.write_text("earlier\n")
    with open(kept, "a") as fd3:
        done = subprocess.run([sys.executable, "-m", "gpupool.cli", "detect", str(data / "good.csv"), "--out",
                               f"/dev/fd/{fd3.fileno()}"], capture_output=True, text=True, env=env, timeout=300,
                              pass_fds=(fd3.fileno(),))
    assert done.returncode == 0, done.stderr
    text = kept.read_text()
    assert text.startswith("earlier\ntimestamp,value,expected") and len(text.splitlines()) == 122


def test_a_full_device_is_one_line(capsys, data):
    """/dev/full answers every write with ENOSPC: one line, not a traceback (the old code
    replaced the link to it and exited 0)."""
    link = data / "full.link"
    link.symlink_to("/dev/full")
    _refused(capsys, data, "detect", str(data / "good.csv"), "--out", str(link),
             needles=("cannot write", "full.link", "No space left"))


# --- what an output must not replace ---------------------------------------------------------


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_link_to_a_regular_file_is_refused(capsys, data, fake_run, no_work, command):
    """Replaced the link with a file and left its target as it was: neither what a user meant."""
    (data / "kept.json").write_text("mine\n")
    link = data / "out.link"
    link.symlink_to("kept.json")
    _refused(capsys, data, *_argv(command, data, link), needles=(str(link), "symbolic link", "kept.json"))


def test_a_link_to_nothing_is_refused(capsys, data, no_work):
    link = data / "out.link"
    link.symlink_to("missing/out.json")
    _refused(capsys, data, "simulate", str(data / "trace.yaml"), "--json", str(link),
             needles=(str(link), "symbolic link", "does not exist"))


def test_a_socket_is_refused(capsys, data, no_work, tmp_path):
    path = Path("/tmp") / f"gpupool-test-{os.getpid()}.sock"  # AF_UNIX paths are short
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        before = _state(data)
        rc, _, err = _cli(capsys, "detect", str(data / "good.csv"), "--out", str(path))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "is a socket" in err, err
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and _state(data) == before
    finally:
        server.close()
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("command", ["detect", "forecast", "forecast-summary", "simulate", "whatif",
                                     "whatif-scenario", "run"])
def test_a_directory_no_file_can_be_made_in_is_refused_before_the_work(capsys, data, fake_run, no_work, command):
    """Found after the whole run, as a traceback; /proc refuses new files even to root."""
    _refused(capsys, data, *_argv(command, data, "/proc/gpupool-out"),
             needles=("/proc/gpupool-out", "directory /proc is not writable"))


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not bind the superuser")
def test_a_read_only_directory_is_refused_before_the_work(capsys, data, no_work):
    locked = data / "locked"
    locked.mkdir(mode=0o555)
    try:
        _refused(capsys, data, "simulate", str(data / "trace.yaml"), "--json", str(locked / "out.json"),
                 needles=("--json", "locked", "not writable"))
    finally:
        locked.chmod(0o755)


# --- the functions themselves ----------------------------------------------------------------


def test_atomic_output_replaces_a_regular_file_in_one_step_and_keeps_it_on_failure(tmp_path):
    from gpupool.errors import UsageError
    from gpupool.tsio import atomic_output, check_output

    out = check_output(tmp_path / "out.json", {})
    out.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_output(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("the work failed")
    assert out.read_text() == "old\n"
    with pytest.raises(UsageError, match="cannot write .*out.json.*No space"):
        with atomic_output(out) as tmp:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert out.read_text() == "old\n"
    with atomic_output(out) as tmp:
        tmp.write_text(json.dumps({"new": 1}))
    assert json.loads(out.read_text()) == {"new": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_atomic_output_checks_a_path_check_output_never_saw(tmp_path):
    """A library caller that skips check_output still never replaces a link."""
    from gpupool.errors import UsageError
    from gpupool.tsio import atomic_output

    (tmp_path / "target").write_text("keep")
    (tmp_path / "link").symlink_to("target")
    with pytest.raises(UsageError, match="symbolic link"):
        with atomic_output(tmp_path / "link") as tmp:
            tmp.write_text("new")
    assert os.readlink(tmp_path / "link") == "target" and (tmp_path / "target").read_text() == "keep"


def test_a_file_of_another_user_in_a_sticky_directory_is_refused(tmp_path, monkeypatch):
    """/tmp-like: the rename would fail after the work (EPERM); refused before it."""
    import gpupool.tsio as tsio
    from gpupool.errors import UsageError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "out.json"
    theirs.write_text("theirs")
    owner = os.stat(theirs).st_uid
    monkeypatch.setattr(tsio.os, "geteuid", lambda: owner + 4242)  # someone else, not the superuser
    monkeypatch.setattr(tsio.os, "access", lambda *a, **k: True)  # mode 666: writable, not replaceable
    with pytest.raises(UsageError, match="another user in a sticky directory"):
        tsio.check_output(theirs, {}, option="--json")
    assert theirs.read_text() == "theirs"


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not bind the superuser")
def test_a_read_only_file_is_refused_not_replaced(capsys, data, no_work):
    kept = data / "kept.json"
    kept.write_text("protected")
    kept.chmod(0o444)
    _refused(capsys, data, "simulate", str(data / "trace.yaml"), "--json", str(kept), needles=("kept.json", "not writable"))
