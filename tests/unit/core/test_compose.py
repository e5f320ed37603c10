"""docker-compose.yaml validates with the Docker client's compose (no engine runs here)."""

import base64
import os
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
SECRETS = {"AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"}


def _compose() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    assert exe, "neither `docker compose` nor `docker-compose` is installed (scripts/install-test-tools.sh installs it)"
    return [exe]


def _config(env_file=None, cwd=None):
    """`compose config -q` on the repository's file, with no secret in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    cmd = [*_compose(), "-f", str(ROOT / "docker-compose.yaml")]
    if env_file:
        cmd += ["--env-file", str(env_file)]
    return subprocess.run([*cmd, "config", "-q"], capture_output=True, text=True, cwd=cwd or ROOT, env=env)


def test_compose_refuses_to_start_without_its_secrets(tmp_path):
    (tmp_path / "empty.env").touch()
    out = _config(env_file=tmp_path / "empty.env", cwd=tmp_path)
    assert out.returncode != 0
    assert "compose-secrets.sh" in out.stderr


def test_compose_file_is_valid_with_the_secrets_the_script_writes(tmp_path):
    env_file = tmp_path / "compose.env"
    run = lambda: subprocess.run(["bash", str(ROOT / "scripts" / "compose-secrets.sh"), str(env_file)],
                                 capture_output=True, text=True, check=True)
    run()
    first = env_file.read_text()
    values = dict(line.split("=", 1) for line in first.splitlines())
    assert set(values) == SECRETS
    assert len(base64.urlsafe_b64decode(values["AIRFLOW__CORE__FERNET_KEY"])) == 32  # a Fernet key
    assert len(values["AIRFLOW__API_AUTH__JWT_SECRET"]) >= 32
    run()  # a second run keeps them: a new Fernet key would make stored connections unreadable
    assert env_file.read_text() == first
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    out = _config(env_file=env_file, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_compose_runs_the_whole_celery_stack():
    spec = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    services = set(spec["services"])
    assert {"postgres", "redis", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "airflow-worker", "airflow-init", "vdc"} <= services
    env = spec["x-airflow-common"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert "gpupool" in env["AIRFLOW_CONN_GPUPOOL_STAGING"]
