"""A real Prometheus scrapes `gpupool nvml serve` (the node agent's /metrics, on the fake NVML of
the source's unit tests) every second: the exposition passes `promtool check metrics`, the scrape
is `up`, and the GPUs' readings and the agent's health series are queryable with their labels.
Fails (never skips) without prometheus."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pynvml
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "sources"))
from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

from tests.integration.conftest import prometheus_query  # noqa: E402

pytestmark = pytest.mark.integration

NODE = "gpu-n001"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_scrapes_the_nvml_agent(tmp_path):
    from gpupool import collector

    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:  # make test installs them: fail, never skip
            pytest.fail(f"{tool} not on PATH: run scripts/install-services.sh (Debian's prometheus package)")
    fake = FakeNvml([FakeGpu(util=64, mem_used=3 * 2**30, processes=[(7, 3 * 2**30)]), FakeGpu(util=0)])
    real = fake.module.nvmlDeviceGetMemoryInfo

    def flaky(handle):  # GPU 1's memory reading fails: NVML answers its identity, not this
        if handle == ("gpu", 1):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(handle)

    fake.module.nvmlDeviceGetMemoryInfo = flaky
    bound, where = threading.Event(), {}

    def ready(host, port):
        where["target"] = f"{host}:{port}"
        bound.set()

    threading.Thread(target=collector.serve, args=("slurm", NODE), daemon=True,
                     kwargs={"port": 0, "nvml": fake.module, "ready": ready}).start()
    assert bound.wait(10)
    text = urllib.request.urlopen(f"http://{where['target']}/metrics", timeout=10).read()
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()

    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "gpupool-nvml", "static_configs": [{"targets": [where["target"]]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if prometheus_query(base, 'gpupool_nvml_up{job="gpupool-nvml"} == 1'):
                    break
            except OSError:
                pass
            assert prom.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        util = {r["metric"]["entity"]: float(r["value"][1]) for r in prometheus_query(base, "gpupool_nvml_gpu_util")}
        assert util == {f"{NODE}/0": 64.0, f"{NODE}/1": 0.0}
        cap = prometheus_query(base, 'gpupool_nvml_gpu_allocated{platform="slurm", node="%s", entity_kind="node"}' % NODE)
        assert [float(r["value"][1]) for r in cap] == [1.0]
        mem = {r["metric"]["entity"] for r in prometheus_query(base, "gpupool_nvml_gpu_mem_used")}
        assert mem == {f"{NODE}/0"}  # GPU 1's failed reading is absent, not zero
        health = {r["metric"]["target"]: float(r["value"][1]) for r in prometheus_query(base, "gpupool_nvml_health_up")}
        assert health["gpu_mem_used"] == 0.0 and health["gpu_util"] == 1.0
        assert prometheus_query(base, 'up{job="gpupool-nvml"} == 1')
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
