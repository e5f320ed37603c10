"""The OpenStack source's history against a real Gnocchi 4.7, and the Gnocchi facade held to it.

Gnocchi runs on loopback behind the session's real Keystone (the `gnocchi` fixture). The
module copies the virtual datacenter's Gnocchi history — its resources and, through Gnocchi's
own API, their measures — into it, then reads it back with the OpenStack source as a
deployment does (Keystone password, catalog, `POST /v1/aggregates` with `(aggregate ...)`),
and asks the same questions of the facade and of Gnocchi, answers compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import openstack
import pandas as pd
import pytest
import requests
import yaml

from gpupool.canonical import HEALTH_ENTITY_KIND
from gpupool.emulator.serve import DEFAULT_PASSWORD, make_state, serve_in_thread
from gpupool.sources.base import RetryPolicy, SourceError
from gpupool.sources.openstack import GnocchiMeter, OpenStackSource
from tests.contract.shapes import shape_diff

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=2)
#: the copied history: twelve hours at the world's 5-minute step, ending at the world's clock
START, END = NOW - timedelta(hours=12), NOW
STEP_S = 300
POLICY = "gpupool-5min"
METRIC = {"service_type": "metric", "interface": "public", "region_name": "RegionOne"}
#: the meters of config/compose/platforms.yaml (the deployment that reads the facade)
METERS = {
    "gpu_capacity": GnocchiMeter("gpu.capacity"),
    "gpu_allocated": GnocchiMeter("gpu.allocated"),
    "gpu_util": GnocchiMeter("gpu.util"),
    "gpu_pending": GnocchiMeter("gpu.pending", entity_kind="partition", resource_type="generic",
                                group_by="original_resource_id"),
}
FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)


@dataclass
class Copied:
    """The facade and the real Gnocchi holding the same history."""

    facade: Any  # openstacksdk connection to the virtual datacenter
    real: Any  # openstacksdk connection to the real Keystone (its catalog names the real Gnocchi)
    facade_urls: dict[str, str]
    gnocchi_url: str
    keystone_url: str
    password: str
    #: (metric name, group value) -> [[iso ts, granularity, value], ...] as written to Gnocchi
    written: dict[tuple[str, str], list[list]]


def _call(conn, method: str, path: str, **kw) -> requests.Response:
    return conn.session.request(path, method, endpoint_filter=METRIC, raise_exc=False,
                                headers={"Accept": "application/json"}, **kw)


def _ok(resp, *codes: int):
    assert resp.status_code in (codes or (200,)), (resp.request.method, resp.url, resp.status_code, resp.text)
    return resp.json() if resp.content else None


@pytest.fixture(scope="module")
def vdc(tmp_path_factory):
    """The virtual datacenter's facades over a small world, clock frozen at NOW."""
    spec = {
        "step": "5min", "decision_every": "1h", "node_gpus": 8, "start": T0.isoformat(),
        "end": (T0 + timedelta(days=3)).isoformat(), "seed": 11,
        "platforms": {"openstack": {"synthetic": {"base": 20, "total_gpus": 32}, "nodes": 4}},
    }
    path = tmp_path_factory.mktemp("gnocchi-scenario") / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    state = make_state(path, speed=0, start_at=NOW.isoformat())
    with serve_in_thread(state) as servers:
        yield servers


@pytest.fixture(scope="module")
def copied(vdc, gnocchi, openstack_services) -> Copied:
    """The facade's resources and measures, written into the real Gnocchi through its API.

    As `ceilometer-upgrade` would, the `nova_compute` resource type (attribute `host_name`) is
    created first; an archive policy keeps 5-minute and 1-hour aggregates. Node resources keep
    the facade's ids; the cloud's is created as "cloud", which Gnocchi keeps as its
    `original_resource_id`, as the facade shows it.
    """
    facade = openstack.connect(
        auth_url=vdc.urls["keystone"], username="gpupool", password=DEFAULT_PASSWORD, project_name="gpupool",
        user_domain_name="Default", project_domain_name="Default", region_name="RegionOne",
        load_envvars=False, load_yaml_config=False, api_timeout=30)
    real = openstack_services.connect()
    _ok(_call(real, "POST", "/v1/archive_policy", json={
        "name": POLICY, "aggregation_methods": ["mean", "max", "min", "sum", "last", "count"],
        "definition": [{"granularity": "5 minutes", "timespan": "7 days"},
                       {"granularity": "1 hour", "timespan": "30 days"}]}), 201)
    _ok(_call(real, "POST", "/v1/resource_type", json={
        "name": "nova_compute", "attributes": {"host_name": {"type": "string", "required": True}}}), 201)

    nodes = {r["id"]: r for r in _ok(_call(facade, "GET", "/v1/resource/nova_compute"))}
    window = {"start": START.isoformat(), "stop": END.isoformat(), "granularity": STEP_S}
    written: dict[tuple[str, str], list[list]] = {}
    batch: dict[str, dict[str, list[dict]]] = {}
    real_ids: dict[str, tuple[str, str]] = {}  # real id -> (type, group value)
    for res in _ok(_call(facade, "GET", "/v1/resource/generic")):
        if res["type"] == "nova_compute":
            body = {"id": res["id"], "host_name": nodes[res["id"]]["host_name"]}
            group = body["host_name"]
        else:
            body = {"id": res["original_resource_id"]}
            group = res["original_resource_id"]
        body.update(project_id=res["project_id"], user_id=res["user_id"],
                    metrics={name: {"archive_policy_name": POLICY} for name in res["metrics"]})
        made = _ok(_call(real, "POST", f"/v1/resource/{res['type']}", json=body), 201)
        real_ids[made["id"]] = (res["type"], group)
        for name, mid in res["metrics"].items():
            points = _ok(_call(facade, "GET", f"/v1/metric/{mid}/measures", params=window))
            written[(name, group)] = points
            batch.setdefault(made["id"], {})[name] = [{"timestamp": ts, "value": v} for ts, _g, v in points]
    _ok(_call(real, "POST", "/v1/batch/resources/metrics/measures", json=batch), 202)
    # no gnocchi-metricd runs: `refresh` has the API aggregate the new measures now
    for rid, (rtype, group) in real_ids.items():
        for name in batch[rid]:
            back = _ok(_call(real, "GET", f"/v1/resource/{rtype}/{rid}/metric/{name}/measures",
                             params={"refresh": "true", **window}))
            assert back == written[(name, group)], (name, group)
    return Copied(facade, real, vdc.urls, gnocchi.url, openstack_services.keystone_url,
                  openstack_services.credentials["gpupool"], written)


def _real_source(c: Copied) -> OpenStackSource:
    return OpenStackSource("openstack", auth_url=c.keystone_url, username="gpupool", password=c.password,
                           project_name="gpupool", region_name="RegionOne", with_nova=False,
                           gnocchi_meters=METERS, retry=FAST_RETRY)


def _facade_source(c: Copied) -> OpenStackSource:
    return OpenStackSource("openstack", connection=c.facade, with_nova=False, gnocchi_meters=METERS,
                           retry=FAST_RETRY)


def _rows(frame: pd.DataFrame) -> list[tuple]:
    cols = ["entity_kind", "entity_id", "metric", "ts", "value", "unit"]
    return sorted(frame[cols].itertuples(index=False, name=None))


def _values(frame: pd.DataFrame) -> pd.DataFrame:
    """The readings of a usage frame, without the meters' health series."""
    return frame[frame["entity_kind"] != HEALTH_ENTITY_KIND]


def _expected(c: Copied, every: str) -> pd.DataFrame:
    """What the written measures make at granularity `every`: Gnocchi's mean of each bucket."""
    rows = []
    for metric, meter in METERS.items():
        for (name, group), points in c.written.items():
            if name == meter.metric:
                rows += [(meter.entity_kind, group, metric, pd.Timestamp(ts), float(v)) for ts, _g, v in points]
    frame = pd.DataFrame(rows, columns=["entity_kind", "entity_id", "metric", "ts", "value"])
    frame = (frame.groupby(["entity_kind", "entity_id", "metric", pd.Grouper(key="ts", freq=every)])["value"]
             .mean().dropna().reset_index())
    return frame


def test_source_reads_back_what_was_written(copied):
    frame = _values(_real_source(copied).usage(START, END, "5min"))
    want = _expected(copied, "5min")
    assert len(frame) == len(want) > 0
    assert set(frame["metric"]) == set(METERS)
    assert set(frame.loc[frame["entity_kind"] == "node", "entity_id"]) == {
        g for (name, g) in copied.written if name == "gpu.util"}
    assert set(frame.loc[frame["metric"] == "gpu_pending", "entity_id"]) == {"cloud"}
    got = {(r.entity_id, r.metric, r.ts): r.value for r in frame.itertuples()}
    assert got == {(r.entity_id, r.metric, r.ts): r.value for r in want.itertuples()}  # exactly: raw points


def test_hourly_reads_are_gnocchis_means_of_the_written_points(copied):
    frame = _values(_real_source(copied).usage(START, END, "1h"))
    want = _expected(copied, "1h")
    assert len(frame) == len(want) > 0
    got = {(r.entity_id, r.metric, r.ts): r.value for r in frame.itertuples()}
    assert got == pytest.approx({(r.entity_id, r.metric, r.ts): r.value for r in want.itertuples()}, abs=1e-9)


@pytest.mark.parametrize("step", ["5min", "1h"])
def test_facade_gives_the_source_what_real_gnocchi_gives(copied, step):
    real = _rows(_real_source(copied).usage(START, END, step))
    fake = _rows(_facade_source(copied).usage(START, END, step))
    assert [r[:4] + r[5:] for r in fake] == [r[:4] + r[5:] for r in real]
    assert [r[4] for r in fake] == pytest.approx([r[4] for r in real], abs=1e-6)


def _both(c: Copied, params: dict, body: dict) -> tuple[requests.Response, requests.Response]:
    return (_call(c.facade, "POST", "/v1/aggregates", params=params, json=body),
            _call(c.real, "POST", "/v1/aggregates", params=params, json=body))


def _approx_tree(value):
    """`value` with every float wrapped in pytest.approx (the facade rounds to 6 decimals)."""
    if isinstance(value, dict):
        return {k: _approx_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx_tree(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, abs=1e-6)
    return value


WINDOW = {"start": START.isoformat(), "stop": END.isoformat()}


@pytest.mark.parametrize("operations,params,rtype", [
    ("(aggregate mean (metric gpu.util mean))", {"groupby": "host_name", "granularity": 300}, "nova_compute"),
    ("(aggregate max (metric gpu.allocated max))", {"groupby": "host_name", "granularity": 3600}, "nova_compute"),
    ("(aggregate sum (metric gpu.capacity mean))", {"granularity": 3600}, "nova_compute"),
    ("(metric gpu.util last)", {"groupby": "host_name", "granularity": 3600}, "nova_compute"),
    ("(aggregate mean (metric gpu.pending mean))", {"groupby": "original_resource_id", "granularity": 300}, "generic"),
])
def test_aggregates_answers_agree(copied, operations, params, rtype):
    body = {"operations": operations, "resource_type": rtype, "search": {}}
    fake, real = _both(copied, {**WINDOW, "fill": "null", **params}, body)
    assert fake.status_code == real.status_code == 200
    assert fake.json() == _approx_tree(real.json())


def test_aggregates_details_carry_references_shaped_as_gnocchis(copied):
    body = {"operations": "(aggregate mean (metric gpu.util mean))", "resource_type": "nova_compute", "search": {}}
    fake, real = _both(copied, {**WINDOW, "groupby": "host_name", "granularity": 3600, "details": "true"}, body)
    assert fake.status_code == real.status_code == 200
    assert [g["group"] for g in fake.json()] == [g["group"] for g in real.json()]
    assert not shape_diff(real.json(), fake.json())
    assert all(len(g["measures"]["references"]) == 1 for g in real.json())
    assert [g["measures"]["references"][0]["id"] for g in fake.json()] == \
        [g["measures"]["references"][0]["id"] for g in real.json()]


@pytest.mark.parametrize("rtype", ["nova_compute", "generic"])
def test_resource_listings_are_shaped_as_gnocchis(copied, rtype):
    fake = _ok(_call(copied.facade, "GET", f"/v1/resource/{rtype}"))
    real = _ok(_call(copied.real, "GET", f"/v1/resource/{rtype}"))
    # the same resources (the cloud's under its original id), each shaped alike with the same metrics
    def key(r):
        return r["id"] if r["type"] == "nova_compute" else r["original_resource_id"]

    real_by = {key(r): r for r in real}
    assert sorted(real_by) == sorted(key(r) for r in fake)
    for r in fake:
        assert not shape_diff(real_by[key(r)], r), key(r)
        assert set(r["metrics"]) == set(real_by[key(r)]["metrics"])
    # seen as generic, a nova_compute resource shows no host_name
    assert all(("host_name" in r) == (rtype == "nova_compute") for r in fake + real)


@pytest.mark.parametrize("case,params,body", [
    # the shape the source used to send: resource_type as a query parameter, none in the body
    ("resource type not in the body", {"groupby": "host_name", "resource_type": "nova_compute"},
     {"operations": "(aggregate mean (metric gpu.util mean))", "search": {}}),
    # the source's old default meter: `generic` resources have no `host`
    ("group by an attribute the type lacks", {"groupby": "host"},
     {"operations": "(aggregate mean (metric gpu.util mean))", "resource_type": "generic", "search": {}}),
    ("unknown metric", {"groupby": "host_name"},
     {"operations": "(aggregate mean (metric gpu.nope mean))", "resource_type": "nova_compute", "search": {}}),
    ("unknown resource type", {"groupby": "host_name"},
     {"operations": "(aggregate mean (metric gpu.util mean))", "resource_type": "nope", "search": {}}),
    ("granularity outside the archive policy", {"groupby": "host_name", "granularity": 60},
     {"operations": "(aggregate mean (metric gpu.util mean))", "resource_type": "nova_compute", "search": {}}),
])
def test_refusals_agree(copied, case, params, body):
    fake, real = _both(copied, {**WINDOW, "fill": "null", **params}, body)
    assert real.status_code in (400, 404), case
    assert (fake.status_code, fake.json()) == (real.status_code, real.json()), case


@pytest.mark.parametrize("meter,reason", [
    (GnocchiMeter("gpu.util", resource_type="generic", group_by="host"),
     "HTTP 400: Invalid pagination: `Sort key supplied is invalid: host'"),
    (GnocchiMeter("gpu.nope"), "HTTP 404: Metric ['gpu.nope'] does not exist"),
    (GnocchiMeter("gpu.util", resource_type="host"), "HTTP 400: Resource type does not exist; host"),
])
def test_a_meter_gnocchi_refuses_is_one_clear_error(copied, meter, reason):
    for make in (_real_source, _facade_source):
        src = make(copied)
        src.gnocchi_meters = {"gpu_util": meter}
        with pytest.raises(SourceError) as err:
            src.usage(START, END, "5min")
        assert str(err.value).endswith(reason) and not err.value.retryable, (make.__name__, str(err.value))
        assert "metric /v1/aggregates" in err.value.endpoint


def test_window_without_history_agrees(copied):
    body = {"operations": "(aggregate mean (metric gpu.util mean))", "resource_type": "nova_compute", "search": {}}
    params = {"start": (T0 - timedelta(days=30)).isoformat(), "stop": (T0 - timedelta(days=29)).isoformat(),
              "groupby": "host_name", "granularity": 300, "fill": "null"}
    fake, real = _both(copied, params, body)
    assert real.status_code == 200 and all(g["measures"]["measures"]["aggregated"] == [] for g in real.json())
    assert fake.json() == real.json()
    assert _real_source(copied).usage(T0 - timedelta(days=30), T0 - timedelta(days=29), "5min").empty


def test_no_token_is_refused_by_both(copied):
    body = {"operations": "(aggregate mean (metric gpu.util mean))", "resource_type": "nova_compute", "search": {}}
    fake = requests.post(copied.facade_urls["openstack"] + "/metric/v1/aggregates", json=body, timeout=30)
    real = requests.post(copied.gnocchi_url + "/v1/aggregates", json=body, timeout=30)
    assert fake.status_code == real.status_code == 401
    # keystonemiddleware answers before Gnocchi does: its error body, and where to get a token
    assert fake.json() == real.json()
    assert real.headers["WWW-Authenticate"] == f'Keystone uri="{copied.keystone_url}"'
    assert fake.headers["WWW-Authenticate"] == f'Keystone uri="{copied.facade_urls["keystone"]}"'



def test_a_measure_absent_at_a_step_is_a_health_gap(copied):
    """Measures written with steps left out: Gnocchi's answer lacks them, and the source's
    health series of the meter says so at those steps (last, as it adds a resource to Gnocchi)."""
    real = copied.real
    _ok(_call(real, "POST", "/v1/resource_type", json={
        "name": "gpupool_gap", "attributes": {"host_name": {"type": "string", "required": True}}}), 201)
    made = _ok(_call(real, "POST", "/v1/resource/gpupool_gap", json={
        "id": "gap-node", "host_name": "gap-node", "metrics": {"gpu.util": {"archive_policy_name": POLICY}}}), 201)
    try:
        steps = pd.date_range(START, END, freq=f"{STEP_S}s", inclusive="left")
        missing = {7, 8, len(steps) - 1}  # two inside the window, and the newest lagging
        _ok(_call(real, "POST", f"/v1/resource/gpupool_gap/{made['id']}/metric/gpu.util/measures", json=[
            {"timestamp": t.isoformat(), "value": float(i % 50)} for i, t in enumerate(steps) if i not in missing]), 202)
        back = _ok(_call(real, "GET", f"/v1/resource/gpupool_gap/{made['id']}/metric/gpu.util/measures",
                         params={"refresh": "true", "start": START.isoformat(), "stop": END.isoformat(),
                                 "granularity": STEP_S}))
        assert len(back) == len(steps) - len(missing)
        src = _real_source(copied)
        src.gnocchi_meters = {"gpu_util": GnocchiMeter("gpu.util", resource_type="gpupool_gap")}
        frame = src.usage(START, END, "5min")
        health = frame[frame["entity_kind"] == HEALTH_ENTITY_KIND].pivot(index="ts", columns="metric", values="value")
        assert list(health.index) == list(steps)
        assert sorted(np.flatnonzero(health["health_up"].to_numpy() == 0)) == sorted(missing)
        age = health["health_sample_age_seconds"]
        assert age.iloc[-1] == STEP_S and age.iloc[8] == 2 * STEP_S and age.drop(age.index[sorted(missing)]).eq(0).all()
        assert not _values(frame)["ts"].isin(steps[sorted(missing)]).any()
    finally:
        _call(real, "DELETE", f"/v1/resource/gpupool_gap/{made['id']}")
        _call(real, "DELETE", "/v1/resource_type/gpupool_gap")
