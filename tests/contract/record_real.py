"""Record responses of the REAL services into tests/fixtures/recorded/ for the contract tests.

    .venv/bin/python -m tests.contract.record_real [prometheus] [openstack] [slurm] [nova] [nova-live]

Starts each real service on loopback with the project's scripts (tests/integration/realservices.py:
Debian's Prometheus backfilled with a few DCGM/Slurm-exporter-shaped series, Keystone +
Placement from PyPI, a one-node Slurm with Debian's slurmrestd), sends the requests the facades answer, and writes
``{"request": ..., "status": ..., "headers": {...}, "body": ...}`` per call. Tokens are never
written (only the bodies and a few non-secret headers). Re-run it when a real service's
version changes; the contract tests compare the facades' shapes against these files. `nova` copies
the Nova API reference's samples out of the nova sdist (PyPI); `nova-live` records a real Nova
started by scripts/nova-services.sh (fake virt driver; run its `install` first).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "recorded"
KEEP_HEADERS = ("content-type", "openstack-api-version", "x-openstack-nova-api-version", "vary")


def save(name: str, resp: requests.Response, request: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    doc = {"request": request, "status": resp.status_code,
           "headers": {k: v for k, v in resp.headers.items() if k.lower() in KEEP_HEADERS}, "body": body}
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"recorded {name}: HTTP {resp.status_code}")


def record_prometheus() -> None:
    from tests.integration.realservices import PrometheusServer

    t0 = 1704067200  # 2024-01-01T00:00:00Z
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for k in range(2):
        for i in range(24):
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{k}",UUID="GPU-0000000{k}",device="nvidia{k}",'
                         f'modelName="NVIDIA A100-SXM4-80GB",Hostname="gpu-n001",hpc_job="101",'
                         f'instance="gpu-n001:9400",job="dcgm-exporter"}} {50 + i} {t0 + 300 * i}')
    lines.append("# TYPE slurm_gpus_alloc gauge")
    for i in range(24):
        lines.append(f'slurm_gpus_alloc{{node="gpu-n001",partition="gpu",instance="slurmctld:8080",'
                     f'job="slurm-exporter"}} {i % 8} {t0 + 300 * i}')
    lines.append("# EOF")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "series.om"
        path.write_text("\n".join(lines) + "\n")
        server = PrometheusServer.start([path])
        try:
            url = server.url
            at = t0 + 300 * 10
            get = lambda p, **q: requests.get(url + p, params=q, timeout=30)  # noqa: E731
            save("prometheus_query_vector", get("/api/v1/query", query="DCGM_FI_DEV_GPU_UTIL", time=at),
                 "GET /api/v1/query?query=DCGM_FI_DEV_GPU_UTIL")
            save("prometheus_query_aggregate", get("/api/v1/query", query="sum by (node) (slurm_gpus_alloc)",
                                                   time=at), "GET /api/v1/query?query=sum by (node) (...)")
            save("prometheus_query_scalar", get("/api/v1/query", query="1", time=at), "GET /api/v1/query?query=1")
            save("prometheus_query_range_matrix",
                 get("/api/v1/query_range", query='slurm_gpus_alloc{node="gpu-n001"}', start=t0,
                     end=t0 + 3600, step=300), "GET /api/v1/query_range")
            save("prometheus_query_range_too_many_points",
                 get("/api/v1/query_range", query="slurm_gpus_alloc", start=t0, end=t0 + 11001, step=1),
                 "GET /api/v1/query_range 11,001 points")
            save("prometheus_query_bad", get("/api/v1/query", query="sum(", time=at), "GET /api/v1/query?query=sum(")
            save("prometheus_query_range_bad_step",
                 get("/api/v1/query_range", query="up", start=t0, end=t0 + 60, step=0), "step=0")
            save("prometheus_series", get("/api/v1/series", **{"match[]": "slurm_gpus_alloc", "start": t0,
                                                               "end": t0 + 7200}), "GET /api/v1/series")
            save("prometheus_series_no_match", get("/api/v1/series"), "GET /api/v1/series without match[]")
            save("prometheus_labels", get("/api/v1/labels", start=t0, end=t0 + 7200), "GET /api/v1/labels")
            save("prometheus_label_values", get("/api/v1/label/Hostname/values", start=t0, end=t0 + 7200),
                 "GET /api/v1/label/Hostname/values")
            save("prometheus_buildinfo", get("/api/v1/status/buildinfo"), "GET /api/v1/status/buildinfo")
        finally:
            server.stop()


def record_openstack() -> None:
    from tests.integration.realservices import OpenStackServices

    proc, dir = OpenStackServices.launch()
    svc = OpenStackServices.wait(proc, dir)
    try:
        auth = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": "gpupool", "domain": {"name": "Default"}, "password": svc.credentials["gpupool"]}}},
            "scope": {"project": {"name": "gpupool", "domain": {"name": "Default"}}}}}
        resp = requests.post(svc.keystone_url + "/auth/tokens", json=auth, timeout=30)
        token = resp.headers["X-Subject-Token"]
        save("keystone_token", resp, "POST /v3/auth/tokens (password, project scope)")
        bad = json.loads(json.dumps(auth))
        bad["auth"]["identity"]["password"]["user"]["password"] = "wrong"
        save("keystone_token_unauthorized", requests.post(svc.keystone_url + "/auth/tokens", json=bad, timeout=30),
             "POST /v3/auth/tokens wrong password")
        save("keystone_token_bad_body", requests.post(svc.keystone_url + "/auth/tokens", json={"auth": {}},
                                                      timeout=30), "POST /v3/auth/tokens {auth: {}}")
        save("keystone_version", requests.get(svc.keystone_url, timeout=30), "GET /v3")
        purl = svc.placement_url
        h = {"X-Auth-Token": token, "OpenStack-API-Version": "placement 1.14"}
        uid = "9b2a1d2e-5b2c-4f8e-8c8e-3f9d0a1b2c3d"
        requests.post(purl + "/resource_providers", json={"name": "compute-gpu001", "uuid": uid},
                      headers=h, timeout=30).raise_for_status()
        inv = {"resource_provider_generation": 0, "inventories": {
            "VCPU": {"total": 64}, "MEMORY_MB": {"total": 524288, "reserved": 4096},
            "PGPU": {"total": 8, "reserved": 0, "max_unit": 8}}}
        save("placement_put_inventories", requests.put(f"{purl}/resource_providers/{uid}/inventories", json=inv,
                                                       headers=h, timeout=30), "PUT inventories")
        save("placement_put_inventories_conflict", requests.put(f"{purl}/resource_providers/{uid}/inventories",
                                                                json=inv, headers=h, timeout=30),
             "PUT inventories with a stale generation")
        save("placement_put_inventories_bad", requests.put(f"{purl}/resource_providers/{uid}/inventories",
                                                           json={"inventories": {}}, headers=h, timeout=30),
             "PUT inventories without generation")
        save("placement_resource_providers", requests.get(purl + "/resource_providers", headers=h, timeout=30),
             "GET /resource_providers (1.14)")
        save("placement_resource_provider", requests.get(f"{purl}/resource_providers/{uid}", headers=h,
                                                         timeout=30), "GET /resource_providers/{uuid} (1.14)")
        save("placement_inventories", requests.get(f"{purl}/resource_providers/{uid}/inventories", headers=h,
                                                   timeout=30), "GET inventories")
        save("placement_usages", requests.get(f"{purl}/resource_providers/{uid}/usages", headers=h, timeout=30),
             "GET usages")
        save("placement_traits", requests.get(f"{purl}/resource_providers/{uid}/traits", headers=h, timeout=30),
             "GET traits")
        h19 = {**h, "OpenStack-API-Version": "placement 1.19"}
        save("placement_aggregates", requests.get(f"{purl}/resource_providers/{uid}/aggregates", headers=h19,
                                                  timeout=30), "GET aggregates (1.19)")
        save("placement_not_found", requests.get(f"{purl}/resource_providers/00000000-0000-0000-0000-000000000000",
                                                 headers=h, timeout=30), "GET unknown provider")
        save("placement_root", requests.get(purl + "/", timeout=30), "GET /")
    finally:
        svc.stop()


def save_doc(name: str, request: str, status: int, body) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"request": request, "status": status, "headers": {}, "body": body}
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"recorded {name}: {status}")


def record_slurmrestd(cluster, running: int, pending: int) -> None:
    """The cluster's slurmrestd (unix socket, local auth, openapi/v0.0.38): what the facade serves."""
    from gpupool.sources.slurmrestd import SlurmRestd

    restd = SlurmRestd(cluster.restd_url)

    def call(name: str, method: str, rel: str) -> None:
        path = rel if rel.startswith("/") else restd.path(rel)
        status, text = restd.send(method, path)
        try:
            body = json.loads(text)
        except ValueError:
            body = text
        save_doc(name, f"{method} {path}", status, body)

    call("slurmrestd_ping", "GET", "ping")
    call("slurmrestd_nodes", "GET", "nodes")
    call("slurmrestd_node", "GET", f"node/{cluster.node}")
    call("slurmrestd_node_unknown", "GET", "node/no-such-node")
    call("slurmrestd_jobs", "GET", "jobs")
    call("slurmrestd_job", "GET", f"job/{running}")
    call("slurmrestd_job_pending", "GET", f"job/{pending}")
    call("slurmrestd_job_unknown", "GET", "job/999999")
    call("slurmrestd_unknown_path", "GET", "/slurm/v0.0.38/no-such-path")
    # local auth acts as slurmrestd's own (unprivileged) user: it may cancel that user's jobs only
    own = int(subprocess.run(
        ["runuser", "-u", "slurm", "--", "sbatch", "--parsable", "--chdir=/tmp", "--gres=gpu:1",
         "--output=/dev/null", "--wrap", "sleep 300"],
        env=cluster.env, capture_output=True, text=True, check=True, timeout=30).stdout.strip().split(";")[0])
    call("slurmrestd_job_cancel", "DELETE", f"job/{own}")
    call("slurmrestd_job_cancel_denied", "DELETE", f"job/{running}")
    status, text = restd.send("GET", "/openapi/v3")
    spec = json.loads(text)
    paths = {p: sorted(ops) for p, ops in spec["paths"].items() if p.startswith("/slurm/")}
    save_doc("slurmrestd_openapi_paths", "GET /openapi/v3 (paths under /slurm/ only)", status,
             {"info": spec.get("info"), "paths": paths})


def record_slurm() -> None:
    from tests.integration.realservices import SlurmCluster

    cluster = SlurmCluster.start(gpus=4)
    try:
        running = cluster.sbatch(2, 300)
        cluster.wait_job_state(running, "RUNNING")
        pending = cluster.sbatch(4, 300)
        time.sleep(1.0)
        cluster.drain("gpupool: contract recording")
        record_slurmrestd(cluster, running, pending)
        # this Slurm's scontrol has no --json; sinfo --json prints the same v0.0.38 node objects
        out = cluster.run("sinfo", "--json").stdout
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "slurm_sinfo_json.json").write_text(json.dumps(
            {"request": "sinfo --json", "status": 0, "headers": {}, "body": json.loads(out)},
            indent=1, sort_keys=True) + "\n")
        print("recorded slurm_sinfo_json")
        text = cluster.run("scontrol", "show", "node").stdout
        (OUT / "slurm_scontrol_show_node.txt").write_text(text)
    finally:
        try:
            cluster.cancel_all()
        except (RuntimeError, TimeoutError, subprocess.SubprocessError):
            pass
        cluster.stop()


#: The Nova API reference's samples, which Nova's own functional tests (api_sample_tests) generate
#: from and check against the real API. (fixture, sample path, request, request body sample)
NOVA_VERSION = "34.0.0"
NOVA_SAMPLES = (
    ("nova_services_list", "os-services/v2.53/services-list-get-resp.json",
     "GET /compute/v2.1/os-services (OpenStack-API-Version: compute 2.53; 2.69 answers the same while all cells "
     "respond)", None),
    ("nova_service_disable", "os-services/v2.53/service-disable-log-put-resp.json",
     "PUT /compute/v2.1/os-services/{service_id} (compute 2.53+)",
     "os-services/v2.53/service-disable-log-put-req.json"),
    ("nova_service_enable", "os-services/v2.53/service-enable-put-resp.json",
     "PUT /compute/v2.1/os-services/{service_id} (compute 2.53+)", "os-services/v2.53/service-enable-put-req.json"),
    ("nova_service_disable_legacy", "os-services/service-disable-log-put-resp.json",
     "PUT /compute/v2.1/os-services/disable-log-reason (compute 2.1)", "os-services/service-disable-log-put-req.json"),
    ("nova_service_enable_legacy", "os-services/service-enable-put-resp.json",
     "PUT /compute/v2.1/os-services/enable (compute 2.1)", "os-services/service-enable-put-req.json"),
    ("nova_hypervisors_detail", "os-hypervisors/v2.88/hypervisors-detail-resp.json",
     "GET /compute/v2.1/os-hypervisors/detail?limit=1 (compute 2.88)", None),
    ("nova_hypervisor_show", "os-hypervisors/v2.88/hypervisors-show-resp.json",
     "GET /compute/v2.1/os-hypervisors/{hypervisor_id} (compute 2.88)", None),
    ("nova_hypervisors_detail_v2_53", "os-hypervisors/v2.53/hypervisors-detail-resp.json",
     "GET /compute/v2.1/os-hypervisors/detail?limit=1 (compute 2.53)", None),
    ("nova_servers_detail_admin", "servers/v2.73/servers-details-resp.json",
     "GET /compute/v2.1/servers/detail?limit=1 (compute 2.73; as an admin: the OS-EXT-SRV-ATTR fields; 2.94 "
     "answers the same keys)", None),
)
#: actions whose answer has no body: (fixture, request body sample, request, status)
NOVA_ACTION_SAMPLES = (
    ("nova_server_live_migrate", "os-migrate-server/v2.30/live-migrate-server.json",
     "POST /compute/v2.1/servers/{server_id}/action os-migrateLive (compute 2.30, what openstacksdk sends; "
     "@wsgi.response(202) in nova/api/openstack/compute/migrate_server.py)", 202),
)


def record_nova(sdist: Path | None = None) -> None:
    """Nova's API reference samples from the nova sdist on PyPI (doc/api_samples/), or from ``sdist``
    (a ``nova-NOVA_VERSION.tar.gz`` already downloaded)."""
    import tarfile

    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            subprocess.run([sys.executable, "-m", "pip", "download", f"nova=={NOVA_VERSION}", "--no-deps",
                            "--no-binary", ":all:", "-d", tmp, "-q"], check=True, timeout=600)
            sdist = Path(tmp) / f"nova-{NOVA_VERSION}.tar.gz"
        with tarfile.open(sdist) as tar:
            def sample(rel: str):
                return json.load(tar.extractfile(f"nova-{NOVA_VERSION}/doc/api_samples/{rel}"))

            for name, rel, request, req_rel in NOVA_SAMPLES:
                doc = {"request": request, "status": 200, "headers": {}, "body": sample(rel),
                       "source": f"nova {NOVA_VERSION} (PyPI sdist), doc/api_samples/{rel}: the Nova API "
                                 "reference's sample, generated by Nova's functional api_samples tests"}
                if req_rel:
                    doc["request_body"] = sample(req_rel)
                (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                print(f"recorded {name} from doc/api_samples/{rel}")
            for name, req_rel, request, status in NOVA_ACTION_SAMPLES:
                doc = {"request": request, "status": status, "headers": {}, "body": None,
                       "request_body": sample(req_rel),
                       "source": f"nova {NOVA_VERSION} (PyPI sdist), doc/api_samples/{req_rel}: the Nova API "
                                 "reference's request sample; the answer has no body"}
                (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
                print(f"recorded {name} from doc/api_samples/{req_rel}")


def record_nova_live(url: str, headers: dict[str, str]) -> None:
    """A running Nova's answers (``url`` = its ``/v2.1`` root) to what gpupool sends through openstacksdk.

    Disables and re-enables the first nova-compute service it lists, so point it at a Nova of
    its own (scripts/nova-services.sh).
    """
    def call(name: str, method: str, path: str, version: str | None, body=None) -> dict:
        h = dict(headers)
        if version:
            h["OpenStack-API-Version"] = f"compute {version}"
        resp = requests.request(method, url + path, headers=h, json=body, timeout=60)
        req = f"{method} /v2.1{path}" + (f" (compute {version})" if version else " (no microversion: 2.1)")
        save(f"nova_live_{name}", resp, req)
        return resp.json()

    services = call("services_list", "GET", "/os-services", "2.69")["services"]
    compute = next(s for s in services if s["binary"] == "nova-compute")
    call("services_host", "GET", f"/os-services?binary=nova-compute&host={compute['host']}", "2.69")
    call("service_disable", "PUT", f"/os-services/{compute['id']}", "2.69",
         {"status": "disabled", "disabled_reason": "gpupool: contract recording"})
    call("service_enable", "PUT", f"/os-services/{compute['id']}", "2.69", {"status": "enabled"})
    call("service_not_found", "PUT", "/os-services/00000000-0000-0000-0000-000000000000", "2.69",
         {"status": "disabled"})
    call("service_bad_status", "PUT", f"/os-services/{compute['id']}", "2.69", {"status": "maybe"})
    host = {"host": compute["host"], "binary": "nova-compute"}
    call("service_disable_legacy", "PUT", "/os-services/disable-log-reason", None,
         {**host, "disabled_reason": "gpupool: contract recording"})
    call("service_enable_legacy", "PUT", "/os-services/enable", None, host)
    hypers = call("hypervisors_detail", "GET", "/os-hypervisors/detail", "2.88")["hypervisors"]
    call("hypervisor_show", "GET", f"/os-hypervisors/{hypers[0]['id']}", "2.88")
    call("hypervisors_detail_v2_53", "GET", "/os-hypervisors/detail", "2.53")
    call("hypervisor_not_found", "GET", "/os-hypervisors/00000000-0000-0000-0000-000000000000", "2.88")


def record_nova_running() -> None:
    """Start a Nova with scripts/nova-services.sh (after its `install`), record it, stop it."""
    from tests.integration.realservices import free_port, new_run_dir, run_script

    dir = new_run_dir("nova")
    try:
        run_script("nova-services.sh", "start", dir, free_port(), free_port(), timeout=600)
        env = dict(line.split("=", 1) for line in (dir / "env").read_text().split())
        record_nova_live(env["NOVA_URL"], {"X-User-Id": "gpupool", "X-Project-Id": "gpupool",
                                           "X-Roles": "admin,member,reader"})
    finally:
        run_script("nova-services.sh", "stop", dir)
        shutil.rmtree(dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    which = argv or ["prometheus", "openstack", "slurm", "nova", "nova-live"]
    for name in which:
        {"prometheus": record_prometheus, "openstack": record_openstack, "slurm": record_slurm,
         "nova": record_nova, "nova-live": record_nova_running}[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
