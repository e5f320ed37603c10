"""Session fixtures for the real services: Prometheus (backfilled), Slurm, Keystone + Placement.

Each service is started by scripts/ on loopback in its own directory under
`.services/runs/` and stopped when the session ends. A service that cannot start fails
the tests that need it, with the reason; nothing here skips. Run
`bash scripts/install-services.sh` first (`make test` does).

Reusable fixtures for other test modules:
  prometheus_history  -> (PrometheusServer, HistoryTruth): 2 days of Slurm + DCGM exporter series
  slurm_cluster       -> SlurmCluster: node name, `env` for Slurm clients, sbatch/drain/resume helpers
  openstack_services  -> OpenStackServices: Keystone/Placement URLs, credentials, `connect()`
  gnocchi             -> GnocchiServer (module scope): Gnocchi registered in that Keystone's catalog
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

# --import-mode=importlib keeps test directories off sys.path; the helpers live beside us.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realservices import (  # noqa: E402
    OpenStackServices,
    PrometheusServer,
    ServiceStartError,
    GnocchiServer,
    SlurmCluster,
    new_run_dir,
    reset_slurm,
    start_gnocchi,
    start_openstack,
    start_slurm_cluster,
)

from gpupool.sources.openmetrics import ClusterShape, write_exporter_history  # noqa: E402

#: the backfilled history: two days at a one-minute step, months before "now"
HISTORY_START = datetime(2026, 1, 5, tzinfo=timezone.utc)
HISTORY_END = HISTORY_START + timedelta(days=2)
HISTORY_SHAPE = ClusterShape(nodes=4, gpus_per_node=4, job_steps=20)


@dataclass
class HistoryTruth:
    """What was backfilled: the shape, the window and the arrays `exporter_history` returned."""

    shape: ClusterShape
    start: datetime
    end: datetime
    arrays: dict[str, np.ndarray]

    def index_of(self, ts: datetime) -> int:
        """Position of instant `ts` in the arrays' time axis."""
        pos = np.searchsorted(self.arrays["ts"], int(ts.timestamp()))
        assert self.arrays["ts"][pos] == int(ts.timestamp()), ts
        return int(pos)


def pytest_collection_modifyitems(config, items):
    """Mark everything here `integration`; start Keystone/Placement early if any test needs them.

    Their start-up is mostly Python imports (~10 s); launching it in the background at
    collection time overlaps it with the Prometheus and Slurm tests.
    """
    here = Path(__file__).resolve().parent
    wants_openstack = False
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
            wants_openstack |= "openstack_services" in getattr(item, "fixturenames", ())
    if wants_openstack and not config.option.collectonly and not hasattr(config, "_gpupool_openstack_launch"):
        try:
            config._gpupool_openstack_launch = OpenStackServices.launch()
        except OSError as exc:
            config._gpupool_openstack_launch = exc


def pytest_sessionfinish(session):
    """Stop Keystone/Placement launched at collection when no test ended up using them."""
    launched = getattr(session.config, "_gpupool_openstack_launch", None)
    if isinstance(launched, tuple) and not getattr(session.config, "_gpupool_openstack_used", False):
        proc, dir = launched
        try:
            OpenStackServices.wait(proc, dir).stop()
        except ServiceStartError:
            pass


@pytest.fixture(scope="session")
def prometheus_history(tmp_path_factory) -> tuple[PrometheusServer, HistoryTruth]:
    """A Prometheus holding 2 days of synthetic Slurm + DCGM exporter history (1-min step)."""
    work = tmp_path_factory.mktemp("openmetrics")
    path = work / "history.om"
    arrays = write_exporter_history(path, HISTORY_SHAPE, HISTORY_START, HISTORY_END, "1min", seed=7)
    try:
        server = PrometheusServer.start([path], dir=new_run_dir("prometheus"))
    except ServiceStartError as exc:
        pytest.fail(f"Prometheus could not start: {exc}")
    yield server, HistoryTruth(HISTORY_SHAPE, HISTORY_START, HISTORY_END, arrays)
    server.stop()


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """A running one-node Slurm cluster with 4 fake GPUs (gres gpu:tesla:4)."""
    cluster = start_slurm_cluster(gpus=4)
    yield cluster
    cluster.stop()


@pytest.fixture
def idle_slurm(slurm_cluster) -> SlurmCluster:
    """The session's Slurm cluster with no jobs and the node resumed, before and after the test."""
    reset_slurm(slurm_cluster)
    yield slurm_cluster
    reset_slurm(slurm_cluster)


@pytest.fixture(scope="session")
def openstack_services(pytestconfig) -> OpenStackServices:
    """Keystone + Placement on loopback (password auth, SQLite, gunicorn)."""
    launched = getattr(pytestconfig, "_gpupool_openstack_launch", None)
    pytestconfig._gpupool_openstack_used = True  # pytest_sessionfinish leaves them to this fixture
    services = start_openstack(launched)
    yield services
    services.stop()


@pytest.fixture(scope="module")
def gnocchi(openstack_services) -> GnocchiServer:
    """Gnocchi (PostgreSQL indexer, file storage, Keystone auth) in the session Keystone's catalog
    as the `metric` service, for one module: it leaves the catalog when the module ends."""
    from tests.conftest import PG_URL

    server = start_gnocchi(openstack_services, PG_URL)
    yield server
    server.stop()
