"""Start, use and stop the real services of the integration tests (scripts/*.sh).

Every service runs on loopback ports picked free at start, with all its state in its
own directory under `.services/runs/`, so two test runs on one machine never share a
daemon. A service that cannot start raises `ServiceStartError` with the script's own
account of why; fixtures turn that into a test failure, never a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
RUNS = ROOT / ".services" / "runs"


class ServiceStartError(RuntimeError):
    """A service that did not come up; the message carries the script's stderr."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(*args: str | Path, timeout: float = 120) -> str:
    """Run a script under scripts/ and return its stdout; raise ServiceStartError on failure."""
    cmd = ["bash", str(SCRIPTS / str(args[0])), *map(str, args[1:])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServiceStartError(f"{' '.join(cmd)} ran over {timeout}s") from exc
    if proc.returncode != 0:
        raise ServiceStartError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout


def new_run_dir(name: str) -> Path:
    """A fresh private directory for one service instance."""
    path = RUNS / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir(parents=True)
    return path


@dataclass
class PrometheusServer:
    """A backfilled Prometheus on loopback."""

    dir: Path
    port: int

    @property
    def url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, openmetrics_files: list[Path], dir: Path | None = None) -> "PrometheusServer":
        """Backfill `openmetrics_files` into a new TSDB and start Prometheus on it."""
        dir = dir or new_run_dir("prometheus")
        run_script("prometheus.sh", "backfill", dir, *openmetrics_files, timeout=300)
        port = free_port()
        run_script("prometheus.sh", "start", dir, port)
        return cls(dir, port)

    def stop(self, keep: bool = False) -> None:
        """Stop the server; remove its directory unless `keep`."""
        run_script("prometheus.sh", "stop", self.dir)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class SlurmCluster:
    """A one-node Slurm cluster with fake GPUs; `env` makes Slurm clients talk to it.

    `restd_url` is its slurmrestd (`unix:<dir>/restd/slurmrestd.sock`, local auth, openapi/v0.0.38).
    """

    dir: Path
    node: str
    gpus: int
    ctld_port: int
    env: dict[str, str] = field(repr=False, default_factory=dict)
    restd_url: str = ""

    @property
    def slurm_conf(self) -> str:
        """Path of this cluster's slurm.conf."""
        return str(self.dir / "slurm.conf")

    @classmethod
    def start(cls, gpus: int = 4, dir: Path | None = None) -> "SlurmCluster":
        """Start munged, slurmctld, slurmd and slurmrestd; return when the node is idle and
        slurmrestd answers."""
        dir = dir or new_run_dir("slurm")
        ctld, slurmd = free_port(), free_port()
        while slurmd == ctld:
            slurmd = free_port()
        run_script("slurm-cluster.sh", "start", dir, ctld, slurmd, gpus)
        values = dict(line.split("=", 1) for line in (dir / "env").read_text().split())
        env = dict(os.environ, SLURM_CONF=values["SLURM_CONF"])
        return cls(dir, values["NODE"], gpus, ctld, env, values["RESTD_URL"])

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, scontrol, ...) against this cluster."""
        proc = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, gpus: int, seconds: int = 300, *extra: str) -> int:
        """Submit a job holding `gpus` GPUs for `seconds`; returns its id."""
        out = self.run("sbatch", "--parsable", f"--gres=gpu:{gpus}", *extra, "--output=/dev/null",
                       "--wrap", f"sleep {seconds}").stdout
        return int(out.strip().split(";")[0])

    def jobs(self) -> list[dict[str, Any]]:
        """squeue --json jobs."""
        return json.loads(self.run("squeue", "--json").stdout)["jobs"]

    def wait_job_state(self, job_id: int, state: str, timeout: float = 15) -> None:
        """Wait until job `job_id` reaches `state` (e.g. "RUNNING")."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = next((j["job_state"] for j in self.jobs() if j["job_id"] == job_id), None)
            if seen == state:
                return
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} is {seen}, not {state}, after {timeout}s")

    def cancel_all(self) -> None:
        """Cancel every job and wait until none holds a GPU."""
        ids = [str(j["job_id"]) for j in self.jobs()]
        if ids:
            self.run("scancel", *ids)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if not [j for j in self.jobs() if j["job_state"] in ("RUNNING", "PENDING", "COMPLETING")]:
                return
            time.sleep(0.1)
        raise TimeoutError("jobs still running 15s after scancel")

    def drain(self, reason: str) -> None:
        """Drain the node with `reason`."""
        self.run("scontrol", "update", f"NodeName={self.node}", "State=DRAIN", f"Reason={reason}")

    def node_state(self) -> str:
        """sinfo's compact state of the node ("idle", "mixed", "drained", "idle*", ...)."""
        return self.run("sinfo", "-h", "-n", self.node, "-o", "%T").stdout.strip()

    def resume(self, timeout: float = 15) -> None:
        """Resume the node and wait until slurmctld hears from slurmd again.

        Right after RESUME the node is NOT_RESPONDING ("idle*") until the next ping.
        """
        self.run("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.node_state()
            if "*" not in state and "drain" not in state:
                return
            time.sleep(0.1)
        raise TimeoutError(f"node {self.node} is {state} {timeout}s after RESUME")

    def stop(self, keep: bool = False) -> None:
        """Cancel jobs and stop the daemons; remove the directory unless `keep`."""
        run_script("slurm-cluster.sh", "stop", self.dir)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class OpenStackServices:
    """Keystone + Placement on loopback; `credentials` holds the generated passwords."""

    dir: Path
    keystone_url: str
    placement_url: str
    credentials: dict[str, str] = field(repr=False, default_factory=dict)

    @staticmethod
    def launch(dir: Path | None = None) -> tuple[subprocess.Popen, Path]:
        """Start the start script in the background (it takes ~10 s); finish with `wait`."""
        dir = dir or new_run_dir("openstack")
        cmd = ["bash", str(SCRIPTS / "openstack-services.sh"), "start", str(dir), str(free_port()), str(free_port())]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return proc, dir

    @classmethod
    def wait(cls, proc: subprocess.Popen, dir: Path, timeout: float = 240) -> "OpenStackServices":
        """Wait for a `launch`ed start and return the running services."""
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            raise ServiceStartError(f"openstack-services.sh start ran over {timeout}s") from exc
        if proc.returncode != 0:
            raise ServiceStartError(f"openstack-services.sh start failed (exit {proc.returncode}):\n{err.strip()}")
        values = dict(line.split("=", 1) for line in (dir / "env").read_text().split())
        creds = json.loads((dir / "credentials.json").read_text())
        return cls(dir, values["KEYSTONE_URL"], values["PLACEMENT_URL"], creds)

    def connect(self, user: str = "gpupool", project: str = "gpupool"):
        """An openstacksdk connection as `user` (password auth through Keystone)."""
        import openstack

        return openstack.connect(
            auth_url=self.keystone_url, username=user, password=self.credentials[user], project_name=project,
            user_domain_name="Default", project_domain_name="Default", region_name="RegionOne",
            load_envvars=False, load_yaml_config=False, api_timeout=30,
        )

    def stop(self, keep: bool = False) -> None:
        """Stop both servers; remove the directory unless `keep`."""
        run_script("openstack-services.sh", "stop", self.dir)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class GnocchiServer:
    """Gnocchi on loopback (PostgreSQL indexer in a database of its own, file storage in `dir`),
    registered as the `metric` service of `openstack`'s Keystone, which authenticates its requests."""

    dir: Path
    url: str
    pg_url: str = field(repr=False)
    database: str

    @classmethod
    def start(cls, openstack: OpenStackServices, pg_url: str, dir: Path | None = None) -> "GnocchiServer":
        """Create a database on `pg_url`'s server, run gnocchi-upgrade on it and serve the API."""
        import sqlalchemy as sa

        dir = dir or new_run_dir("gnocchi")
        database = f"gnocchi_{os.getpid()}_{time.monotonic_ns()}"
        admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
        except sa.exc.OperationalError as exc:
            raise ServiceStartError(f"PostgreSQL at {pg_url} unreachable: {exc.orig}") from exc
        finally:
            admin.dispose()
        # Gnocchi's indexer speaks psycopg2 (the default driver of a plain postgresql:// URL)
        indexer = sa.make_url(pg_url).set(drivername="postgresql", database=database)
        server = cls(dir, "", pg_url, database)
        try:
            run_script("gnocchi-services.sh", "start", dir, free_port(), openstack.keystone_url,
                       openstack.dir / "credentials.json", indexer.render_as_string(hide_password=False), timeout=180)
        except ServiceStartError:
            server._drop_database()
            raise
        values = dict(line.split("=", 1) for line in (dir / "env").read_text().split())
        server.url = values["GNOCCHI_URL"]
        return server

    def _drop_database(self) -> None:
        import sqlalchemy as sa

        admin = sa.create_engine(self.pg_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'))
        finally:
            admin.dispose()

    def stop(self, keep: bool = False) -> None:
        """Stop the API, take it out of Keystone's catalog, drop the database; remove the
        directory unless `keep`."""
        run_script("gnocchi-services.sh", "stop", self.dir)
        self._drop_database()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class RedfishEmulator:
    """sushy-tools' Redfish BMC emulator on loopback (fake systems driver): one ComputerSystem
    per name in `systems`, powered on, behind HTTP basic auth as `user` / `password`."""

    dir: Path
    url: str
    systems: tuple[str, ...]
    user: str = "gpupool-bmc"
    password: str = field(repr=False, default="")

    @classmethod
    def start(cls, systems: tuple[str, ...], dir: Path | None = None) -> "RedfishEmulator":
        """Start the emulator with `systems`; return when it answers."""
        import secrets

        dir = dir or new_run_dir("redfish")
        password = secrets.token_urlsafe(12)
        run_script("redfish-emulator.sh", "start", dir, free_port(), cls.user, password, *systems, timeout=60)
        values = dict(line.split("=", 1) for line in (dir / "env").read_text().split())
        return cls(dir, values["REDFISH_URL"], tuple(systems), password=password)

    def stop(self, keep: bool = False) -> None:
        """Stop the emulator; remove its directory unless `keep`."""
        run_script("redfish-emulator.sh", "stop", self.dir)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


# --- bodies of the session fixtures of tests/integration and tests/integration_actuation -------


def start_redfish(systems: tuple[str, ...]) -> RedfishEmulator:
    """`RedfishEmulator.start` for a fixture: an emulator that cannot start fails the test, with the reason."""
    import pytest

    try:
        return RedfishEmulator.start(systems)
    except ServiceStartError as exc:
        pytest.fail(f"the Redfish emulator could not start: {exc}")


def start_slurm_cluster(gpus: int) -> SlurmCluster:
    """`SlurmCluster.start` for a fixture: a cluster that cannot start fails the test, with the reason."""
    import pytest

    try:
        return SlurmCluster.start(gpus=gpus)
    except ServiceStartError as exc:
        pytest.fail(f"Slurm could not start: {exc}")


def reset_slurm(cluster: SlurmCluster, *, resume_unless_idle: bool = False) -> None:
    """Cancel every job, then resume the node if a test left it drained.

    With `resume_unless_idle`, resume whenever the node is not "idle" (sinfo's "*", "~" and "#"
    suffixes ignored: "*" is slurmd slow to answer on a loaded machine, not a state to resume from).
    """
    cluster.cancel_all()
    state = cluster.node_state()
    if resume_unless_idle:
        stuck = state.rstrip("*~#") != "idle"
    else:
        stuck = "drain" in state
    if stuck:
        cluster.resume()


def start_openstack(launched: tuple[subprocess.Popen, Path] | OSError | None = None) -> OpenStackServices:
    """Keystone + Placement for a fixture: finish `launched` (what an earlier `OpenStackServices.launch()`
    returned or raised) or launch them now; services that cannot start fail the test, with the reason."""
    import pytest

    try:
        if isinstance(launched, OSError):
            raise ServiceStartError(f"cannot run scripts/openstack-services.sh: {launched}")
        proc, dir = launched if launched else OpenStackServices.launch()
        return OpenStackServices.wait(proc, dir)
    except ServiceStartError as exc:
        pytest.fail(f"Keystone/Placement could not start: {exc}")


def start_gnocchi(openstack: OpenStackServices, pg_url: str) -> GnocchiServer:
    """`GnocchiServer.start` for a fixture: a Gnocchi that cannot start fails the test, with the reason."""
    import pytest

    try:
        return GnocchiServer.start(openstack, pg_url)
    except ServiceStartError as exc:
        pytest.fail(f"Gnocchi could not start: {exc}")
