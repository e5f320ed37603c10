"""The pool-page command `make demo` prints at its end works as printed: from another directory,
in a shell whose PATH lacks the venv, where `airflow standalone` starts its children as `airflow`
found on PATH (it logged FileNotFoundError: 'airflow' for each of them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

DEMO = Path(__file__).resolve().parents[3] / "scripts" / "demo.sh"

#: a stand-in for the venv's airflow: `standalone` starts a child the way Airflow's does
FAKE_AIRFLOW = """#!/bin/sh
if [ "$1" = standalone ]; then exec airflow child; fi
echo "child AIRFLOW_HOME=$AIRFLOW_HOME DAGS=$AIRFLOW__CORE__DAGS_FOLDER EXAMPLES=$AIRFLOW__CORE__LOAD_EXAMPLES"
echo "child GPUPOOL_STAGING_URL=$GPUPOOL_STAGING_URL"
"""


def _printed_command(repo: Path) -> str:
    """Run the closing lines of demo.sh (what it prints after the report) in ``repo``."""
    text = DEMO.read_text()
    tail = text[text.index('echo "report:'):]
    env = {"PATH": "/usr/bin:/bin", "BIN": ".venv/bin", "AIRFLOW_HOME": str(repo / ".airflow"),
           "GPUPOOL_STAGING_URL": f"sqlite:///{repo}/.airflow/gpupool_staging.db", "LOG": "demo.log"}
    done = subprocess.run(["bash", "-c", tail], cwd=repo, env=env, capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pool page:"))
    command = []
    for line in lines[start:]:
        command.append(line.removeprefix("pool page:").strip().removesuffix("\\"))
        if not line.endswith("\\"):
            break
    return " ".join(command)


def test_the_printed_airflow_standalone_command_works_as_printed(tmp_path):
    repo = tmp_path / "a checkout"  # a space in the path, as a home directory may have
    (repo / ".venv" / "bin").mkdir(parents=True)
    fake = repo / ".venv" / "bin" / "airflow"
    fake.write_text(FAKE_AIRFLOW)
    fake.chmod(0o755)
    command = _printed_command(repo)
    assert command.endswith("airflow standalone"), command
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(["bash", "-c", command], cwd=elsewhere, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, (command, done.stderr)
    assert f"child AIRFLOW_HOME={repo / '.airflow'} DAGS={repo / 'dags'} EXAMPLES=False" in done.stdout
    assert f"child GPUPOOL_STAGING_URL=sqlite:///{repo}/.airflow/gpupool_staging.db" in done.stdout
