"""The NVML node agent end to end, on the fake NVML the source's unit tests use (the real
`pynvml` binding's types and error codes, NVML's rules): `gpupool nvml push` run every 5 minutes
of an hour on a slurm node stages its snapshots in PostgreSQL staging; the platform's own
extract of that hour, which replaces the rows it reads, leaves them; the detect stage reads them
back and cleans them, and the read whose NVML call failed (the agent's health series says so) is
cleaned as no measurement, not raised as an alarm. `gpupool nvml serve` answers a Prometheus
scrape with the same snapshot.
"""

from __future__ import annotations

import sys
import threading
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pynvml
import pytest
import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "sources"))
from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

pytestmark = pytest.mark.slow

END = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
START = END - timedelta(hours=1)
NODE = "gpu-n001"
FAILED_AT = START + timedelta(minutes=30)  # GPU 1's utilisation read fails in this run


def _config(tmp_path: Path) -> Path:
    """The embedded virtual datacenter's platforms, cleaning node and GPU series too."""
    platforms = [{"name": p, "kind": "simulator", "min_nodes": 1} for p in ("openstack", "slurm", "kubernetes")]
    path = tmp_path / "platforms.yaml"
    path.write_text(yaml.safe_dump({"platforms": platforms, "detect": {"entity_kinds": ["platform", "node", "gpu"]}}))
    return path


def _agent_run(monkeypatch, fake: FakeNvml, args: list[str], capsys) -> tuple[int, str, str]:
    """One `gpupool nvml ...` run on this host, its NVML library the fake."""
    from gpupool.cli import main

    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    rc = main(["nvml", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _fail_util_of_gpu(fake: FakeNvml, index: int):
    """NVML answers GPU ``index``'s identity but not its utilisation (NVML_ERROR_UNKNOWN)."""
    real = fake.module.nvmlDeviceGetUtilizationRates

    def flaky(handle):
        if handle == ("gpu", index):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle)

    return flaky


def test_pushed_readings_survive_the_extract_and_the_detect_stage_reads_them(tmp_path, monkeypatch, capsys,
                                                                              staging_url):
    from gpupool import pipeline
    from gpupool.canonical import HEALTH_ENTITY_KIND, collector_cluster
    from gpupool.staging import reads
    from gpupool.staging.schema import clean_sample

    from gpupool.staging import db

    config = _config(tmp_path)
    db.upgrade(db.make_engine(staging_url))  # the pipeline migrates staging; an agent never does
    fake = FakeNvml([FakeGpu(util=90, mem_used=40 * 2**30, processes=[(4242, 40 * 2**30)]), FakeGpu(util=0)])
    steps = pd.date_range(START, END, freq="5min", inclusive="left")
    for i, at in enumerate(steps):
        fake.gpus[0].util = 80 + i % 5  # a busy GPU, steady
        flaky = at == pd.Timestamp(FAILED_AT)
        if flaky:
            monkeypatch.setattr(fake.module, "nvmlDeviceGetUtilizationRates", _fail_util_of_gpu(fake, 1))
        rc, out, err = _agent_run(monkeypatch, fake, ["push", "--platform", "slurm", "--node", NODE, "--at",
                                                      at.isoformat(), "--config", str(config), "--staging-url",
                                                      staging_url], capsys)
        assert rc == 0, err
        if flaky:
            monkeypatch.undo()
        report = yaml.safe_load(out)
        assert report["gpus"] == 2 and report["cluster"] == collector_cluster(NODE)
        assert report["unhealthy"] == (["gpu_util"] if flaky else []), report
    assert fake.init_count == 0  # every run shut NVML down again

    # a rerun of one instant replaces it, never doubles it
    rc, _, err = _agent_run(monkeypatch, fake, ["push", "--platform", "slurm", "--node", NODE, "--at",
                                                steps[0].isoformat(), "--config", str(config), "--staging-url",
                                                staging_url], capsys)
    assert rc == 0, err

    ctx = pipeline.Context.load(str(config), staging_url)
    assert ctx.engine.dialect.name == "postgresql"
    mine = dict(platform="slurm", cluster=collector_cluster(NODE))
    pushed = reads.read_samples(ctx.engine, START, END, **mine)
    values = pushed[pushed["entity_kind"] != HEALTH_ENTITY_KIND]
    assert len(values[values["metric"] == "gpu_capacity"]) == len(steps)
    assert set(values["entity_id"]) == {NODE, f"{NODE}/0", f"{NODE}/1"}
    # GPU 1's utilisation has no row where its read failed; the rest of that run is staged
    util1 = values[(values["entity_id"] == f"{NODE}/1") & (values["metric"] == "gpu_util")]
    assert len(util1) == len(steps) - 1 and pd.Timestamp(FAILED_AT) not in set(util1["ts"])

    # the platform's own hourly extract (and a rerun of it) leaves the agent's rows alone
    window = pipeline.Window(START, END)
    for _ in range(2):
        assert pipeline.extract(ctx, "slurm", window)["rows"] > 0
    after = reads.read_samples(ctx.engine, START, END, **mine)
    assert len(after) == len(pushed)
    exporter = reads.read_samples(ctx.engine, START, END, "slurm")
    assert (exporter["cluster"] != mine["cluster"]).any()  # the extract's own rows are there too

    # the detect stage reads the agent's series and cleans them
    result = pipeline.detect(ctx, "slurm", window)
    assert result["provenance_faults"] >= 1, result
    with ctx.engine.connect() as conn:
        clean = pd.read_sql(sa.select(clean_sample).where(clean_sample.c.cluster == mine["cluster"]), conn)
    clean["ts"] = pd.to_datetime(clean["ts"], utc=True)
    assert {(r.entity_id, r.metric) for r in clean.itertuples()} >= {
        (NODE, "gpu_capacity"), (NODE, "gpu_allocated"), (f"{NODE}/0", "gpu_util"), (f"{NODE}/1", "gpu_util")}
    # GPU 0's utilisation in the run whose util read failed elsewhere: the health series says
    # that read is not trusted, so it is cleaned, and no alarm is raised on it
    at_fault = clean[(clean["entity_id"] == f"{NODE}/0") & (clean["metric"] == "gpu_util") & (clean["ts"] == FAILED_AT)]
    assert len(at_fault) == 1 and bool(at_fault["cleaned"].iloc[0]) and not bool(at_fault["is_anomaly"].iloc[0])


def test_an_unknown_platform_unmigrated_staging_or_a_host_without_nvml_is_one_line(tmp_path, monkeypatch, capsys, staging_url):
    config = _config(tmp_path)
    base = ["--config", str(config), "--staging-url", staging_url]
    rc, _, err = _agent_run(monkeypatch, FakeNvml([FakeGpu()]), ["push", "--platform", "lab", "--node", NODE, *base], capsys)
    assert rc == 2 and err.count("\n") == 1 and "no platform named 'lab'" in err
    for bad in ("gpu n001", "", "n" * 124):  # a name no platform gives, or one staging cannot hold
        rc, _, err = _agent_run(monkeypatch, FakeNvml([FakeGpu()]), ["push", "--platform", "slurm", "--node", bad, *base],
                                capsys)
        assert rc == 2 and err.count("\n") == 1 and "give the node's name" in err, err
    rc, _, err = _agent_run(monkeypatch, FakeNvml([FakeGpu()]), ["push", "--platform", "slurm", "--node", NODE, *base],
                            capsys)
    assert rc == 2 and err.count("\n") == 1 and "run `gpupool db upgrade`" in err  # staging not migrated yet
    from gpupool.staging import db

    db.upgrade(db.make_engine(staging_url))
    no_driver = FakeNvml([FakeGpu()], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    rc, _, err = _agent_run(monkeypatch, no_driver, ["push", "--platform", "slurm", "--node", NODE, *base], capsys)
    assert rc == 2 and err.count("\n") == 1 and "nvmlInit failed" in err


def test_serve_answers_a_scrape_with_the_snapshot(monkeypatch):
    from prometheus_client.parser import text_string_to_metric_families

    from gpupool import collector

    fake = FakeNvml([FakeGpu(util=77, mem_used=2**30, processes=[(1, 2**30)]), FakeGpu(util=5)])
    monkeypatch.setattr(fake.module, "nvmlDeviceGetUtilizationRates", _fail_util_of_gpu(fake, 1))
    bound = threading.Event()
    where = {}

    def ready(host, port):
        where["url"] = f"http://{host}:{port}/metrics"
        bound.set()

    threading.Thread(target=collector.serve, args=("slurm", NODE), kwargs={"port": 0, "nvml": fake.module, "ready": ready},
                     daemon=True).start()
    assert bound.wait(10)
    text = urllib.request.urlopen(where["url"], timeout=10).read().decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    node = (("node", NODE), ("platform", "slurm"))
    assert got[("gpupool_nvml_up", node)] == 1
    assert got[("gpupool_nvml_gpu_capacity", tuple(sorted([("entity", NODE), ("entity_kind", "node"), *node])))] == 2
    assert got[("gpupool_nvml_gpu_util", tuple(sorted([("entity", f"{NODE}/0"), ("entity_kind", "gpu"), *node])))] == 77
    assert not any(k[0] == "gpupool_nvml_gpu_util" and ("entity", f"{NODE}/1") in k[1] for k in got)
    assert got[("gpupool_nvml_health_up", tuple(sorted([("target", "gpu_util"), *node])))] == 0
    assert fake.init_count == 0
