"""docker-compose.yaml validates with the Docker client's compose (no engine runs here)."""

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def _compose() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    assert exe, "neither `docker compose` nor `docker-compose` is installed (scripts/install-test-tools.sh installs it)"
    return [exe]


def test_compose_file_is_valid():
    out = subprocess.run([*_compose(), "-f", str(ROOT / "docker-compose.yaml"), "config", "-q"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_compose_runs_the_whole_celery_stack():
    spec = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    services = set(spec["services"])
    assert {"postgres", "redis", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "airflow-worker", "airflow-init", "vdc"} <= services
    env = spec["x-airflow-common"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert "gpupool" in env["AIRFLOW_CONN_GPUPOOL_STAGING"]
