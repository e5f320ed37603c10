"""Small inputs whose grids would be huge are refused in one line, before any memory is taken."""

from __future__ import annotations

import pandas as pd
import pytest

from gpupool.cli import main
from gpupool.forecast.io import MAX_GRID_POINTS, forecast_csv
from gpupool.sim.scenario import scenario_from_dict
from gpupool.sim.traces import MAX_WORLD_STEPS, TraceError, read_helios
from gpupool.sim.world import World
from gpupool.tsio import SeriesInputError


def test_forecast_refuses_a_grid_beyond_the_limit_naming_step_and_span(tmp_path, capsys):
    # a thousand one-second samples, then a point a day for a year: the grid is the span at 1 s
    secs = pd.date_range("2026-01-01", periods=1000, freq="s")
    days = pd.date_range("2026-01-02", periods=365, freq="D")
    path = tmp_path / "mixed.csv"
    pd.DataFrame({"ts": secs.append(days).strftime("%Y-%m-%d %H:%M:%S"), "v": 1.0}).to_csv(path, index=False)
    with pytest.raises(SeriesInputError) as err:
        forecast_csv(path, 24, tmp_path / "o.csv")
    text = str(err.value)
    assert str(path) in text and "0 days 00:00:01" in text and f"{MAX_GRID_POINTS:,}" in text and "365 days" in text
    assert main(["forecast", str(path), "--horizon", "24", "--out", str(tmp_path / "o.csv")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "o.csv").exists()


def _helios(path, times):
    pd.DataFrame({"time": times, "running_gpu_num": 1, "pending_gpu_num": 0, "total_gpu_num": 8}).to_csv(path, index=False)


def test_a_trace_spanning_a_century_is_refused_naming_span_and_step(tmp_path):
    path = tmp_path / "century.csv"
    _helios(path, ["1990-01-01 00:00", "2040-01-01 00:00", "2090-01-01 00:00"])
    with pytest.raises(TraceError) as err:
        read_helios(path, "5min")
    text = str(err.value)
    assert str(path) in text and "1990-01-01" in text and "2090-01-01" in text and "0 days 00:05:00" in text
    assert f"{MAX_WORLD_STEPS:,}" in text
    _helios(path, ["2026-01-01 00:00", "2026-01-02 00:00", "2026-01-03 00:00"])  # a short one still reads
    assert len(read_helios(path, "5min")) == 2 * 288 + 1


def test_a_synthetic_window_beyond_the_limit_is_refused(tmp_path):
    raw = {
        "step": "5min", "start": "1990-01-01", "end": "2090-01-01", "node_gpus": 8,
        "platforms": {"slurm": {"synthetic": {"base": 10, "total_gpus": 16}, "nodes": 2}},
    }
    with pytest.raises(TraceError, match=r"the scenario's window: spans 1990-01-01 .*steps of 0 days 00:05:00"):
        World(scenario_from_dict(raw, where="test"))


# --- special files, sizes and encodings: gpupool.inputfiles -----------------------------------------


import gzip  # noqa: E402 - the sections of this module keep their imports beside them
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

from gpupool import inputfiles  # noqa: E402
from gpupool.config import ConfigError, load_config  # noqa: E402
from gpupool.errors import one_line, shown  # noqa: E402
from gpupool.inputfiles import InputFileError, load_yaml, parse_yaml, read_text  # noqa: E402
from gpupool.sim.scenario import ScenarioError, load_scenario  # noqa: E402


def _special(tmp_path: Path, kind: str) -> Path:
    """A path under tmp_path (or /dev/zero) that is no regular file."""
    if kind == "character device":
        return Path("/dev/zero")
    path = tmp_path / kind.replace(" ", "_")
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "directory":
        path.mkdir()
    return path


@pytest.mark.parametrize("kind, reason", [
    ("character device", "is a character device, not a regular file"),
    ("FIFO", "is a FIFO, not a regular file"),
    ("socket", "is a socket, not a regular file"),
    ("directory", "is a directory"),
    ("missing", "no such file"),
])
def test_what_is_no_regular_file_is_named_not_read(tmp_path, kind, reason):
    path = _special(tmp_path, kind)
    with pytest.raises(InputFileError) as err:
        read_text(path, "scenario", 1000)
    assert str(err.value) == f"{path}: cannot read scenario: {reason}"
    assert inputfiles.file_problem(path, 1000) == reason


def test_a_file_over_its_limit_is_refused_by_its_size_before_it_is_read(tmp_path):
    big = tmp_path / "big.csv"
    with open(big, "wb") as fh:  # sparse: a size on paper, no bytes on disk
        fh.truncate(inputfiles.MAX_SERIES_BYTES + 1)
    limit = inputfiles.MAX_SERIES_BYTES
    with pytest.raises(InputFileError, match=rf"big.csv: cannot read CSV: is {limit + 1:,} bytes, "
                                             rf"more than the {limit:,} a CSV may hold"):
        read_text(big, "CSV", inputfiles.MAX_SERIES_BYTES)
    # /proc files say they are empty: the bytes read are bounded all the same
    with pytest.raises(InputFileError, match="holds more than 10 bytes, the most a trace may hold"):
        read_text("/proc/self/status", "trace", 10)


@pytest.mark.parametrize("suffix, write", [
    (".gz", lambda path, data: path.write_bytes(gzip.compress(data))),
    (".zip", lambda path, data: zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED).writestr("a.csv", data)),
])
def test_a_compressed_file_is_bounded_by_what_it_holds_once_decompressed(tmp_path, suffix, write):
    small, bomb = tmp_path / f"small.csv{suffix}", tmp_path / f"bomb.csv{suffix}"
    write(small, b"\xef\xbb\xbfts,v\n2026-01-01,1\n")
    write(bomb, b"0" * 100_000)  # a few hundred bytes on disk
    assert read_text(small, "trace", 1000, decompress=True) == "ts,v\n2026-01-01,1\n"
    assert bomb.stat().st_size < 1000
    with pytest.raises(InputFileError, match="holds more than 1,000 bytes once decompressed"):
        read_text(bomb, "trace", 1000, decompress=True)


def test_text_is_utf8_with_a_byte_order_mark_dropped(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: caf\xc3\xa9\n")
    assert read_text(path, "scenario", 100) == "a: café\n"
    path.write_bytes(b"a: 1\nb: caf\xe9\n")  # Latin-1
    with pytest.raises(InputFileError, match=r"^\S+a.yaml: cannot read scenario: not UTF-8 text \(undecodable byte "
                                             r"0xe9 at offset 11, line 2\)$"):
        read_text(path, "scenario", 100)


def _alias_bomb(levels: int = 9) -> str:
    """About 600 bytes of YAML whose nested aliases stand for 10**levels values."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n  ".join(lines)


def test_yaml_aliases_and_nesting_are_bounded():
    text = "v:\n  " + _alias_bomb()
    assert len(text) < 700
    with pytest.raises(InputFileError, match=r"^bomb.yaml: line \d+: aliases stand for more than 10,000 values"):
        parse_yaml(text, "bomb.yaml")
    # aliases within the budget read as YAML reads them, merge keys included
    assert parse_yaml("a: &x [1, 2]\nb: *x\nc: {<<: {k: 1}, d: *x}\n", "w") == {
        "a": [1, 2], "b": [1, 2], "c": {"k": 1, "d": [1, 2]}}
    deep = "platforms: " + "[" * 5000 + "]" * 5000
    with pytest.raises(InputFileError, match=rf"^deep.yaml: line 1: nested deeper than {inputfiles.MAX_YAML_DEPTH} "
                                             r"levels$"):
        parse_yaml(deep, "deep.yaml")
    fits = "a: " + "[" * (inputfiles.MAX_YAML_DEPTH - 1) + "]" * (inputfiles.MAX_YAML_DEPTH - 1)
    value, levels = parse_yaml(fits, "w"), 0
    while isinstance(value, (dict, list)) and value:  # the mapping, then its nested lists
        value, levels = (value["a"] if isinstance(value, dict) else value[0]), levels + 1
    assert levels == inputfiles.MAX_YAML_DEPTH - 1 and value == []


@pytest.mark.parametrize("text, reason", [
    ("a: " + "9" * 5000, r"not valid YAML \(Exceeds the limit"),
    ("a: 2026-13-45", r"not valid YAML \(month must be in 1..12\)"),
    ("a: [unclosed\n", r"not valid YAML \((did not find )?expected ',' or '\]'.* at line 2, column 1"),
    ("a: 1\n---\nb: 2\n", r"not valid YAML \(but found another document at line 2"),
])
def test_a_scalar_yaml_cannot_build_is_one_line_not_a_traceback(text, reason):
    with pytest.raises(InputFileError, match=rf"^w.yaml: {reason}"):
        parse_yaml(text, "w.yaml")


def test_a_value_is_shown_in_one_short_line_whatever_its_size():
    nested = [1] * 10
    for _ in range(30):  # 10**31 values, shared: never rendered whole
        nested = [nested] * 10
    for value in (nested, "x" * 10_000, "a\x1b[31mb\nc", 10**5000, {"k": list(range(10_000))}):
        text = shown(value)
        assert len(text) <= 60 and "\n" not in text and "\x1b" not in text
    assert shown("5min") == "'5min'"
    assert one_line("a\n  b " + "c" * 1000, 50) == "a b " + "c" * 45 + "…"


# --- platforms.yaml and scenarios --------------------------------------------------------------


def test_a_non_utf8_or_special_platforms_yaml_is_one_config_error(tmp_path):
    latin = tmp_path / "platforms.yaml"
    latin.write_bytes("platforms: [{name: s, kind: simulator}]\n# café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"platforms.yaml: cannot read platforms.yaml: not UTF-8 text \(undecodable "
                                          r"byte 0xe9 at offset 45, line 2\)"):
        load_config(latin)
    latin.write_bytes("\ufeffplatforms: [{name: s, kind: simulator}]\n# café\n".encode("utf-8"))
    assert load_config(latin).platforms[0].name == "s"
    for kind in ("character device", "FIFO", "directory"):
        with pytest.raises(ConfigError, match=f"cannot read platforms.yaml: is a {kind}"):
            load_config(_special(tmp_path, kind))
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(50 * 2**20)
    with pytest.raises(ConfigError, match=f"more than the {inputfiles.MAX_CONFIG_BYTES:,} a platforms.yaml may hold"):
        load_config(big)


@pytest.mark.parametrize("step, reason", [
    ("0min", "'0min': give a whole number of seconds from 1s to 1h"),
    ("-5min", "'-5min': give a whole number of seconds from 1s to 1h"),
    ("banana", "'banana' is not a duration such as 5min, 30s or 1h"),
    ("'300'", "'300' has no unit"),
    ("0.5s", "'0.5s': give a whole number of seconds"),
    ("2h", "'2h': give a whole number of seconds from 1s to 1h"),
])
def test_a_step_no_stage_can_use_is_refused_at_load(tmp_path, step, reason):
    path = tmp_path / "platforms.yaml"
    path.write_text(f"platforms: [{{name: s, kind: simulator}}]\nstep: {step}\n")
    with pytest.raises(ConfigError, match=f"key 'step': {reason}"):
        load_config(path)


def test_steps_the_sources_read_still_load(tmp_path):
    path = tmp_path / "platforms.yaml"
    for step in ("5min", "5m", "30s", "1h", "90s"):
        path.write_text(f"platforms: [{{name: s, kind: simulator}}]\nstep: {step}\n")
        assert load_config(path).step == step


@pytest.mark.parametrize("key, value", [("cooldown_hours", ".inf"), ("move_minutes", ".nan"),
                                        ("max_actuation_age_hours", "1e300"), ("horizon_hours", "1000000000")])
def test_durations_of_the_limits_are_finite_and_bounded(tmp_path, key, value):
    path = tmp_path / "platforms.yaml"
    path.write_text(f"platforms: [{{name: s, kind: simulator}}]\nlimits: {{{key}: {value}}}\n")
    with pytest.raises(ConfigError, match=f"key 'limits.{key}'"):
        load_config(path)


def test_an_alias_bomb_in_platforms_yaml_or_a_scenario_is_refused(tmp_path):
    cfg = tmp_path / "platforms.yaml"
    cfg.write_text("platforms: [{name: s, kind: simulator}]\ndry_run:\n  " + _alias_bomb() + "\n")
    with pytest.raises(ConfigError, match=r"platforms.yaml: line \d+: aliases stand for more than"):
        load_config(cfg)
    for key in ("fastpath", "step"):
        sc = tmp_path / f"{key}.yaml"
        sc.write_text("start: 2026-01-01\nend: 2026-01-02\nplatforms: {s: {synthetic: {base: 1, total_gpus: 8}}}\n"
                      f"{key}:\n  " + _alias_bomb() + "\n")
        with pytest.raises(ScenarioError, match=rf"{key}.yaml: line \d+: aliases stand for more than"):
            load_scenario(sc)


def test_a_long_bad_value_is_never_echoed_whole(tmp_path):
    long = "[" + ", ".join(str(i) for i in range(5000)) + "]"
    cfg = tmp_path / "platforms.yaml"
    cfg.write_text(f"platforms: [{{name: s, kind: simulator}}]\ndry_run: {long}\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "key 'dry_run'" in str(err.value) and len(str(err.value)) < 300
    for key in ("fastpath", "step", "decision_every"):
        sc = tmp_path / f"{key}.yaml"
        sc.write_text("start: 2026-01-01\nend: 2026-01-02\nplatforms: {s: {synthetic: {base: 1, total_gpus: 8}}}\n"
                      f"{key}: {long}\n")
        with pytest.raises(ScenarioError) as err:
            load_scenario(sc)
        assert f"{key}: not a duration: [0, 1, 2" in str(err.value) and len(str(err.value)) < 300


def test_a_scenario_trace_that_is_no_regular_file_is_named(tmp_path):
    fifo = _special(tmp_path, "FIFO")
    sc = tmp_path / "s.yaml"
    sc.write_text(f"platforms: {{s: {{trace: [{fifo.name}]}}}}\n")
    with pytest.raises(ScenarioError, match=rf"s.yaml: platforms.s.trace.0: {fifo} is a FIFO, not a regular file"):
        load_scenario(sc)
    sc.write_text("platforms: {s: {nodes: 2, trace: [{format: sacct, path: /dev/zero}]}}\n"
                  "start: 2026-01-01\nend: 2026-01-02\n")
    with pytest.raises(ScenarioError, match=r"platforms.s.trace.0.path: /dev/zero is a character device"):
        load_scenario(sc)


# --- the CLI: one line, exit 2, inputs unchanged, in a bounded process -------------------------------------


def _hostile_cases(root: Path) -> list[tuple[list[str], dict[str, str], str]]:
    """``(argv, environment, needle)`` of every hostile input, its files written under ``root``."""
    fifo = _special(root, "FIFO")
    bomb = "dry_run:\n  " + _alias_bomb()
    files = {
        "bomb.yaml": "platforms: [{name: s, kind: simulator}]\n" + bomb + "\n",
        "deep.yaml": "platforms: " + "[" * 5000 + "]" * 5000 + "\n",
        "fast.yaml": "start: 2026-01-01\nend: 2026-01-02\nplatforms: {s: {synthetic: {base: 1, total_gpus: 8}}}\n"
                     "fastpath:\n  " + _alias_bomb() + "\n",
        "step.yaml": "platforms: [{name: s, kind: simulator}]\nstep: 0min\n",
        "helios.csv": "time,running_gpu_num,pending_gpu_num,total_gpu_num\n"
                      + "".join(f"2026-01-01 {h:02d}:00,1,0,900000\n" for h in range(24)),
        "helios.yaml": "platforms: {s: {trace: helios.csv}}\n",
        "jobs.txt": "JobID|Submit|Start|End|State|AllocTRES|ReqTRES|Partition\n"
                    "1|2026-01-01T00:00:00|2026-01-01T00:00:00|2026-01-02T00:00:00|COMPLETED|gres/gpu=8|gres/gpu=8|g\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "latin.yaml").write_bytes("platforms: [{name: s, kind: simulator}]\n# café\n".encode("latin-1"))
    out = str(root / "out.csv")
    summary = ["summary", "--start", "2026-01-01", "--end", "2026-01-02"]
    cfg = lambda name: {"GPUPOOL_CONFIG": str(root / name)}  # noqa: E731
    return [
        (["simulate", "/dev/zero"], {}, "/dev/zero: cannot read scenario: is a character device, not a regular file"),
        (["simulate", str(fifo)], {}, "cannot read scenario: is a FIFO, not a regular file"),
        (["simulate", str(root)], {}, "cannot read scenario: is a directory"),
        (["simulate", str(root / "fast.yaml")], {}, "aliases stand for more than 10,000 values"),
        (["simulate", str(root / "helios.yaml")], {}, "112,500 nodes over"),
        (summary, {"GPUPOOL_CONFIG": "/dev/zero"}, "cannot read platforms.yaml: is a character device"),
        (summary, {"GPUPOOL_CONFIG": str(fifo)}, "cannot read platforms.yaml: is a FIFO"),
        (summary, cfg("bomb.yaml"), "aliases stand for more than 10,000 values"),
        (summary, cfg("deep.yaml"), "nested deeper than"),
        (summary, cfg("latin.yaml"), "not UTF-8 text (undecodable byte 0xe9 at offset 45, line 2)"),
        (summary, cfg("step.yaml"), "key 'step': '0min'"),
        (["detect", "/dev/zero", "--out", out], {}, "cannot read CSV: is a character device"),
        (["forecast", str(fifo), "--horizon", "3", "--out", out], {}, "cannot read CSV: is a FIFO"),
        (["whatif", "--slurm", "/dev/zero"], {}, "--slurm /dev/zero: /dev/zero is a character device"),
        (["whatif", "--slurm", f"sacct:{fifo}", "--slurm-nodes", "2"], {}, "is a FIFO, not a regular file"),
        (["whatif", "--slurm", "csv:/dev/zero", "--slurm-nodes", "2"], {}, "/dev/zero is a character device"),
        (["whatif", "--slurm", str(root / "helios.csv")], {}, "its traces' total_gpu_num of 900,000 in 8-GPU nodes"),
        (["whatif", "--slurm", f"sacct:{root / 'jobs.txt'}", "--slurm-nodes", "10000000"], {},
         "10,000,000 nodes over"),
    ]


def _digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file()}


def test_hostile_inputs_answer_in_one_line_and_change_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    root = tmp_path / "in"
    root.mkdir()
    cases = _hostile_cases(root)
    before = _digest(root)
    for argv, env, needle in cases:
        monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert needle in err and len(err) < 600, (argv, err)
    assert _digest(root) == before and sorted(p.name for p in root.iterdir()) == sorted(
        [*before, "FIFO"])  # nothing written beside them


_DRIVER = """
import contextlib, io, json, os, resource, sys, time
from gpupool.cli import main
out = []
for argv, env in json.loads(sys.argv[1]):
    os.environ.pop("GPUPOOL_CONFIG", None)
    os.environ.update(env)
    err = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    out.append([rc, err.getvalue(), time.perf_counter() - t])
print(json.dumps({"cases": out, "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def test_hostile_inputs_in_a_process_limited_to_a_gigabyte(tmp_path):
    """The same cases in one process whose address space is capped: before, /dev/zero read until
    memory ran out and a FIFO or an alias bomb never answered (the timeout fails the test)."""
    import resource

    root = tmp_path / "in"
    root.mkdir()
    cases = _hostile_cases(root)
    include = str(Path(__file__).resolve().parents[3] / "include")
    env = {**os.environ, "PYTHONPATH": include + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "GPUPOOL_STAGING_URL": f"sqlite:///{tmp_path / 'staging.db'}", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("GPUPOOL_CONFIG", None)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps([[a, e] for a, e, _ in cases])],
                          capture_output=True, text=True, env=env, timeout=300, preexec_fn=cap)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for (argv, _, needle), (rc, err, _) in zip(cases, result["cases"]):
        assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, (argv, err[:500])
