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
  gpupool_prometheus  -> base URL of a Prometheus scraping `gpupool metrics serve` every second, on
                         staging arranged so that every shipped alert fires and every dashboard
                         panel has data (the shipped alert rules loaded)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import yaml

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
    # under xdist every worker collects, and only the one that runs this directory needs them:
    # there the fixture starts them when first used
    in_worker = "PYTEST_XDIST_WORKER" in os.environ
    if wants_openstack and not in_worker and not config.option.collectonly and not hasattr(config, "_gpupool_openstack_launch"):
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


# --- gpupool scraped by a real Prometheus ------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
ALERT_RULES = ROOT / "config" / "prometheus" / "gpupool-alerts.yml"
sys.path.insert(0, str(ROOT / "tests" / "unit" / "metrics"))

import metrics_staged  # noqa: E402

#: the instant `gpupool metrics serve` describes: just after the staged pipeline passes
SCRAPED_AT = metrics_staged.END + timedelta(minutes=5)
SCRAPED_PLATFORMS = ("openstack", "slurm", "kubernetes", "lab")


def prometheus_get(url: str) -> dict:
    """GET a Prometheus API URL and decode its JSON."""
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def prometheus_query(base: str, expr: str) -> list:
    """An instant query's result vector (asserting the query succeeded)."""
    res = prometheus_get(f"{base}/api/v1/query?query=" + urllib.parse.quote(expr))
    assert res["status"] == "success", res
    return res["data"]["result"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _arrange_scraped(engine) -> None:
    """Staging where every shipped alert should fire at SCRAPED_AT (with `_scraped_config`):
    slurm's newest total says 6 GPUs pending (the others can lend idle nodes); kubernetes'
    one-hour-ahead forecasts of the last day all said 0 GPUs, far worse than repeating
    yesterday; one live handover failed and one is past its deadline; a wake of a parked
    kubernetes node was refused and is past its deadline (a slurm node's wake went well); a reclaim of
    a node kubernetes owns is open past its reclaim_minutes, its eviction refused by a disruption
    budget; the config names a
    platform `lab` that was never extracted (stale, and below its min_nodes). For the
    dashboard's panels also: a live handover that finished (the duration histogram has a
    value) and a plan decided a horizon and more before (a plan whose outcome is known)."""
    from gpupool.actuation import handover as ho
    from gpupool.staging.schema import allocation_plan, forecast, handover, sample

    end = metrics_staged.END
    with engine.begin() as conn:
        newest = conn.execute(sa.select(sa.func.max(sample.c.ts)).where(
            sample.c.platform == "slurm", sample.c.metric == "gpu_pending", sample.c.entity_kind == "platform")).scalar()
        conn.execute(sample.update().where(sample.c.platform == "slurm", sample.c.metric == "gpu_pending",
                                           sample.c.entity_kind == "platform", sample.c.ts == newest).values(value=6.0))
        conn.execute(forecast.delete().where(forecast.c.platform == "kubernetes", forecast.c.step == 1))
        hours = [end - timedelta(hours=h) for h in range(1, 25)]
        conn.execute(forecast.insert(), [dict(platform="kubernetes", series="demand", issued_at=t, step=1, ts=t, yhat=0.0,
                                              yhat_lower=0.0, yhat_upper=0.0) for t in hours])
        plan = conn.execute(sa.select(allocation_plan).order_by(allocation_plan.c.id.desc()).limit(1)).first()
        assert plan is not None, "metrics_staged.fill decided no plan"
        old = dict(plan._mapping)
        old.pop("id")
        old["decided_at"] = end - timedelta(hours=int((old["summary"] or {}).get("horizon_hours") or 2) + 1)
        conn.execute(allocation_plan.insert(), [old])
    hid = ho.open_handover(engine, "gpu-x1", "slurm", "kubernetes", end - timedelta(hours=1), dry_run=False)
    with engine.begin() as conn:
        conn.execute(handover.update().where(handover.c.id == hid).values(state=ho.FAILED, error="attach refused"))
    ho.open_handover(engine, "gpu-x2", "openstack", "kubernetes", end - timedelta(hours=3), dry_run=False,
                     timeout=timedelta(hours=1))
    done = ho.open_handover(engine, "gpu-x3", "kubernetes", "openstack", end - timedelta(hours=5), dry_run=False)
    with engine.begin() as conn:
        conn.execute(handover.update().where(handover.c.id == done).values(
            state=ho.DONE, updated_at=end - timedelta(hours=5) + timedelta(minutes=12)))
    # a parked kubernetes node whose wake someone else's cordon refused, now past its deadline
    from gpupool.staging import power

    for frm, to, at, deadline in (("on", "parking", end - timedelta(hours=2), None),
                                  ("parking", "parked", end - timedelta(hours=2) + timedelta(minutes=5), None),
                                  ("parked", "waking", end - timedelta(minutes=30), end - timedelta(minutes=15))):
        assert power.transition(engine, "gpu-p1", "kubernetes", frm, to, at, by="plan", deadline=deadline) is not None
    assert power.set_error(engine, "gpu-p1", "waking", "left alone: cordoned by someone else", end - timedelta(minutes=29))
    # and a slurm node parked for an hour and woken in six minutes (the wake latency has a value)
    for frm, to, at, deadline in (("on", "parking", end - timedelta(hours=3), None),
                                  ("parking", "parked", end - timedelta(hours=3), None),
                                  ("parked", "waking", end - timedelta(hours=2), end - timedelta(hours=2) + timedelta(minutes=15)),
                                  ("waking", "on", end - timedelta(hours=2) + timedelta(minutes=6), None)):
        assert power.transition(engine, "gpu-p2", "slurm", frm, to, at, by="plan", deadline=deadline) is not None
    # a reclaim of a node kubernetes owns, its need 50 minutes old against its reclaim_minutes 30,
    # its last eviction refused by the borrower's disruption budget
    rid = ho.open_handover(engine, "gpu-r1", "slurm", "kubernetes", end - timedelta(minutes=48), dry_run=False,
                           kind=ho.RECLAIM, need_since=end - timedelta(minutes=50), state=ho.RELEASING)
    ho.update_handover(engine, ho.get_handover(engine, rid), end - timedelta(minutes=2), error=(
        f"will retry: eviction refused (429); {ho.BLOCKED_BY}ml/train-pdb; the reclaim's deadline falls at "
        f"{(end - timedelta(minutes=20)).isoformat()} (kubernetes's reclaim_minutes 30)"))


def _scraped_config(path: Path) -> Path:
    platforms = [{"name": p, "kind": "simulator", "min_nodes": 1} for p in ("openstack", "slurm", "kubernetes")]
    platforms[2]["reclaim_minutes"] = 30  # an ownership key: the ownership families are exported
    path.write_text(yaml.safe_dump({"platforms": platforms + [{"name": "lab", "kind": "simulator", "min_nodes": 2}]}))
    return path


@pytest.fixture(scope="session")
def gpupool_prometheus(tmp_path_factory):
    """`gpupool metrics serve` at SCRAPED_AT on arranged staging, scraped every 3 s by a
    Prometheus that loads the shipped alert rules: yields Prometheus' base URL once the first
    scrape is in. Fails (never skips) without prometheus."""
    from gpupool.staging import db

    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:  # make test installs them: fail, never skip
            pytest.fail(f"{tool} not on PATH: run scripts/install-services.sh (Debian's prometheus package)")
    tmp = tmp_path_factory.mktemp("metrics_prometheus")
    url = f"sqlite:///{tmp / 'staging.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    metrics_staged.fill(engine, hours=1)
    _arrange_scraped(engine)
    engine.dispose()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "include")}
    gp = subprocess.Popen([sys.executable, "-m", "gpupool.cli", "metrics", "serve", "--port", "0", "--staging", url,
                           "--config", str(_scraped_config(tmp / "platforms.yaml")), "--at", SCRAPED_AT.isoformat()],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    prom = None
    try:
        line = gp.stdout.readline()
        assert line.startswith("gpupool metrics: serving "), line + gp.stderr.read()
        target = urllib.parse.urlparse(line.split()[-1]).netloc
        # a scrape computes the exposition from staging: on a loaded machine (the suite runs on
        # every core) that can take longer than a second, and a scrape past its timeout is `up` 0
        config = {"global": {"scrape_interval": "3s", "scrape_timeout": "3s", "evaluation_interval": "1s"},
                  "rule_files": [str(ALERT_RULES)],
                  "scrape_configs": [{"job_name": "gpupool", "static_configs": [{"targets": [target]}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        check = subprocess.run(["promtool", "check", "config", str(tmp / "prometheus.yml")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        port = _free_port()
        log = open(tmp / "prometheus.log", "w")
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:  # until the first scrape is in
            try:
                if prometheus_query(base, 'up{job="gpupool"} == 1'):
                    break
            except OSError:
                pass
            assert prom.poll() is None and time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(3.5)  # a second scrape, for the expressions over a range (increase, rate)
        yield base
    finally:
        for proc in (prom, gp):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
