"""OpenStack: GPU inventory from Placement (+ Nova), usage history from Gnocchi.

Placement knows every compute node as a root resource provider and, with Nova's vGPU
support, each physical GPU as a child provider holding a `VGPU` inventory; PCI
passthrough GPUs appear as `PGPU` or `CUSTOM_PCI_*` inventories. Nova marks the root
provider of a disabled compute service with the `COMPUTE_STATUS_DISABLED` trait, so
Placement alone says whether a node is schedulable; when Nova is reachable its service
status and disabled reason are used instead. History comes from Ceilometer's storage,
Gnocchi, for the configured meters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping

import keystoneauth1.exceptions as ksa_exc
import openstack
import openstack.exceptions as sdk_exc
import numpy as np
import pandas as pd

from gpupool.canonical import (
    CANONICAL_METRICS,
    HEALTH_ENTITY_KIND,
    HEALTH_METRICS,
    CanonicalFrameError,
    empty_samples,
    health_target,
    normalize_samples,
)
from gpupool.sources.base import (
    PermanentError,
    Pressure,
    RetryPolicy,
    SourceError,
    TransientError,
    aligned_points,
    as_utc,
    call_with_retry,
    format_window,
    inventory_record,
    pressure_from_records,
    step_seconds,
)

log = logging.getLogger(__name__)

#: resource classes whose inventory counts whole physical GPUs
DEFAULT_PGPU_CLASSES = ("PGPU",)
#: resource class prefixes that count whole GPUs (PCI passthrough aliases)
DEFAULT_PGPU_PREFIXES = ("CUSTOM_PCI_",)
#: resource classes of GPU slices: each provider holding one is one physical GPU
DEFAULT_VGPU_CLASSES = ("VGPU",)
#: Nova sets this trait on the root provider of a disabled nova-compute service
DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"


@dataclass(frozen=True)
class GnocchiMeter:
    """How one canonical metric is read from Gnocchi.

    metric:        Gnocchi metric name (the Ceilometer meter), e.g. "gpu.util"
    aggregation:   Gnocchi aggregation method stored in the archive policy ("mean", "max")
    resource_type: Gnocchi resource type searched; Ceilometer files compute-node meters under
                   "nova_compute" (attribute "host_name"); "generic" has only the attributes
                   every resource has ("id", "original_resource_id", "project_id", ...)
    group_by:      attribute of `resource_type` naming the entity ("host_name", "id", ...);
                   Gnocchi refuses an attribute the type does not have (HTTP 400)
    entity_kind:   canonical entity kind of the groups
    scale:         factor applied to values (e.g. MiB -> bytes)
    unit:          canonical unit; None takes the canonical metric's
    """

    metric: str
    aggregation: str = "mean"
    resource_type: str = "nova_compute"
    group_by: str = "host_name"
    entity_kind: str = "node"
    scale: float = 1.0
    unit: str | None = None


class OpenStackSource:
    """An OpenStack cloud read through openstacksdk with explicit credentials.

    Parameters
    ----------
    platform: configured platform instance name
    auth_url, username, password, project_name, user_domain_name, project_domain_name,
    region_name, interface: Keystone password authentication and catalog selection
    endpoint_overrides: service type -> URL used instead of the catalog's (e.g. a proxy)
    connection: an already built `openstack.connection.Connection` (e.g. from clouds.yaml)
        used instead of the password parameters
    cluster: value of the cluster column (e.g. the region)
    vgpu_classes, pgpu_classes, pgpu_prefixes: which resource classes are GPUs
    model_trait_prefix: a provider trait `<prefix><MODEL>` names the GPU model
    with_nova: read compute services for schedulability (raises if Nova is absent)
    gnocchi_meters: canonical metric -> GnocchiMeter for `usage`
    timeout: seconds per API call; retry: RetryPolicy for every call
    """

    def __init__(
        self,
        platform: str,
        *,
        auth_url: str | None = None,
        username: str | None = None,
        password: str | None = None,
        project_name: str | None = None,
        user_domain_name: str = "Default",
        project_domain_name: str = "Default",
        region_name: str | None = None,
        interface: str = "public",
        endpoint_overrides: Mapping[str, str] | None = None,
        connection: Any = None,
        cluster: str = "",
        vgpu_classes: tuple[str, ...] = DEFAULT_VGPU_CLASSES,
        pgpu_classes: tuple[str, ...] = DEFAULT_PGPU_CLASSES,
        pgpu_prefixes: tuple[str, ...] = DEFAULT_PGPU_PREFIXES,
        model_trait_prefix: str = "CUSTOM_GPU_MODEL_",
        with_nova: bool = True,
        gnocchi_meters: Mapping[str, GnocchiMeter] | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        verify: bool = True,
    ):
        if connection is None and not (auth_url and username and password and project_name):
            raise ValueError(f"{platform}: pass auth_url, username, password, project_name or a connection")
        self.platform = platform
        self.auth_url = auth_url
        self.region_name = region_name
        self.interface = interface
        self.cluster = cluster
        self.vgpu_classes = tuple(vgpu_classes)
        self.pgpu_classes = tuple(pgpu_classes)
        self.pgpu_prefixes = tuple(pgpu_prefixes)
        self.model_trait_prefix = model_trait_prefix
        self.with_nova = with_nova
        self.gnocchi_meters = dict(gnocchi_meters or {})
        self.timeout = timeout
        self.retry = retry
        if connection is not None:
            self._conn = connection
        else:
            # No clouds.yaml, no OS_* variables: exactly the parameters given.
            self._conn = openstack.connect(
                auth_url=auth_url,
                username=username,
                password=password,
                project_name=project_name,
                user_domain_name=user_domain_name,
                project_domain_name=project_domain_name,
                region_name=region_name,
                interface=interface,
                verify=verify,
                api_timeout=timeout,
                load_envvars=False,
                load_yaml_config=False,
                **{f"{svc}_endpoint_override": url for svc, url in (endpoint_overrides or {}).items()},
            )

    # ------------------------------------------------------------ helpers
    def _call(self, endpoint: str, window: str, fn: Callable[[], Any]) -> Any:
        where = f"{endpoint} via {self.auth_url}" if self.auth_url else endpoint

        def describe(exc: BaseException) -> SourceError:
            return SourceError(self.platform, where, window, str(exc))

        return call_with_retry(lambda: _classified(fn, self.timeout), policy=self.retry, describe=describe)

    def _placement_json(self, path: str, window: str, microversion: str = "1.14") -> Any:
        endpoint = f"placement {path}"

        def get() -> Any:
            resp = self._conn.placement.get(path, microversion=microversion, raise_exc=False)
            _raise_for_status(resp.status_code)
            try:
                return resp.json()
            except ValueError as exc:
                raise PermanentError("malformed payload: not JSON") from exc

        return self._call(endpoint, window, get)

    def _is_gpu_class(self, rc: str) -> bool:
        return rc in self.vgpu_classes or rc in self.pgpu_classes or rc.startswith(self.pgpu_prefixes)

    # ---------------------------------------------------------- inventory
    def inventory(self, at: datetime) -> list[dict[str, Any]]:
        """GPU nodes from Placement (and Nova when `with_nova`), as they are when called.

        One record per root provider (compute node) whose tree holds GPU inventory.
        """
        window = format_window(as_utc(at, "at"))
        trees = self._gpu_trees(window)
        nova = self._nova_state(window) if self.with_nova else {}
        out = []
        for root_id, tree in trees.items():
            root = tree["root"]
            gpus = busy = 0
            slices: dict[str, int] = {}
            model = None
            fully_reserved = True
            for prov in tree["gpu_providers"]:
                for rc, inv in prov["inventories"].items():
                    if not self._is_gpu_class(rc):
                        continue
                    total = int(inv["total"])
                    used = int(prov["usages"].get(rc, 0))
                    fully_reserved &= int(inv.get("reserved", 0)) >= total
                    if rc in self.vgpu_classes:
                        gpus += 1
                        busy += 1 if used > 0 else 0
                        slices[rc] = slices.get(rc, 0) + total
                    else:
                        gpus += total
                        busy += used
                for trait in prov["traits"]:
                    if trait.startswith(self.model_trait_prefix) and model is None:
                        model = trait[len(self.model_trait_prefix):].lower()
            name = root["name"]
            drain_reason = None
            if name in nova:
                schedulable, drain_reason = nova[name]
            elif DISABLED_TRAIT in tree["root_traits"]:
                schedulable, drain_reason = False, DISABLED_TRAIT
            else:
                schedulable = True
            if schedulable and fully_reserved:
                schedulable, drain_reason = False, "all GPU inventory reserved"
            out.append(
                inventory_record(
                    node=name,
                    platform=self.platform,
                    gpus=gpus,
                    gpu_model=model,
                    mig_layout=slices or None,
                    schedulable=schedulable,
                    drain_reason=drain_reason,
                    busy_gpus=min(busy, gpus),
                )
            )
        return sorted(out, key=lambda r: r["node"])

    def _gpu_trees(self, window: str) -> dict[str, dict[str, Any]]:
        """Root provider id -> root, its traits and its providers holding GPU inventory."""
        listing = self._placement_json("/resource_providers", window)
        try:
            providers = {p["uuid"]: p for p in listing["resource_providers"]}
        except (KeyError, TypeError) as exc:
            raise SourceError(self.platform, "placement /resource_providers", window, "malformed payload") from exc
        trees: dict[str, dict[str, Any]] = {}
        for uuid, prov in providers.items():
            invs = self._placement_json(f"/resource_providers/{uuid}/inventories", window)
            try:
                inventories = dict(invs["inventories"])
            except (KeyError, TypeError) as exc:
                raise SourceError(self.platform, f"placement /resource_providers/{uuid}/inventories", window,
                                  "malformed payload") from exc
            if not any(self._is_gpu_class(rc) for rc in inventories):
                continue
            usages = self._placement_json(f"/resource_providers/{uuid}/usages", window).get("usages", {})
            traits = self._placement_json(f"/resource_providers/{uuid}/traits", window).get("traits", [])
            root_id = prov.get("root_provider_uuid") or uuid
            if root_id not in providers:
                raise SourceError(self.platform, "placement /resource_providers", window,
                                  f"provider {uuid} has unknown root {root_id}")
            tree = trees.setdefault(root_id, {"root": providers[root_id], "gpu_providers": [], "root_traits": None})
            tree["gpu_providers"].append({"uuid": uuid, "inventories": inventories, "usages": usages, "traits": traits})
        for root_id, tree in trees.items():
            own = next((p for p in tree["gpu_providers"] if p["uuid"] == root_id), None)
            tree["root_traits"] = set(
                own["traits"] if own else
                self._placement_json(f"/resource_providers/{root_id}/traits", window).get("traits", [])
            )
        return trees

    def _nova_state(self, window: str) -> dict[str, tuple[bool, str | None]]:
        """Hypervisor hostname -> (schedulable, reason) from Nova's services and hypervisors."""
        services = self._call("compute os-services", window, lambda: list(self._conn.compute.services()))
        hypers = self._call("compute os-hypervisors", window,
                            lambda: list(self._conn.compute.hypervisors(details=True)))
        by_host = {}
        for svc in services:
            if svc.binary != "nova-compute":
                continue
            up = svc.state == "up"
            enabled = svc.status == "enabled"
            reason = None if (up and enabled) else (svc.disabled_reason or ("down" if not up else "disabled"))
            by_host[svc.host] = (up and enabled, reason)
        out = {}
        for hv in hypers:
            host = (hv.service_details or {}).get("host") if hasattr(hv, "service_details") else None
            if host in by_host:
                out[hv.name] = by_host[host]
        return out

    def snapshot(self, at: datetime) -> pd.DataFrame:
        """Current `gpu_capacity` and `gpu_allocated` per node from Placement, stamped `at`.

        Placement has no history; this is what the hourly run records for "now".
        """
        rows = []
        for rec in self.inventory(at):
            for metric, value in (("gpu_capacity", rec["gpus"]), ("gpu_allocated", rec["busy_gpus"])):
                rows.append((self.platform, self.cluster, "node", rec["node"], metric, at, float(value), "gpus"))
        if not rows:
            return empty_samples()
        frame = pd.DataFrame(rows, columns=["platform", "cluster", "entity_kind", "entity_id", "metric", "ts",
                                            "value", "unit"])
        return normalize_samples(frame, where=f"{self.platform} placement snapshot [{format_window(at)}]")

    def pressure(self, at: datetime, step: str = "5min") -> Pressure:
        """Pressure now from Placement (+ Nova): capacity and allocation of the open compute
        nodes' GPU inventories and usages, idle = open nodes with no GPU in use.

        OpenStack has no queue: a boot that does not fit fails (NoValidHost) instead of
        waiting. Pending is the newest point of a configured `gpu_pending` Gnocchi meter (a
        site's own count of refused or queued GPU requests) over the last three `step`s; with
        no such meter it is 0 and `notes` says so.
        """
        at = as_utc(at, "at")
        records = self.inventory(at)
        placement = "placement /resource_providers (+ inventories, usages)"
        prov = {"nodes": placement + (" + compute os-services" if self.with_nova else ""),
                "gpus_allocated": placement, "gpus_capacity": placement}
        notes: list[str] = []
        meter = self.gnocchi_meters.get("gpu_pending")
        if meter is None:
            pending = 0.0
            prov["gpus_pending"] = "none: OpenStack does not queue GPU requests"
            notes.append("OpenStack has no notion of pending GPU demand and no gpu_pending meter is configured: "
                         "pending read as 0")
        else:
            step_s = step_seconds(step)
            first = datetime.fromtimestamp((at.timestamp() // step_s - 2) * step_s, tz=at.tzinfo)
            window = format_window(first, at)
            payload = self._gnocchi_aggregates(meter, first, at, step_s, window)
            frame = gnocchi_groups_to_frame(payload, self.platform, self.cluster, "gpu_pending", meter, window)
            frame = frame[frame["ts"] <= pd.Timestamp(at)]
            newest = frame.sort_values("ts").groupby("entity_id")["value"].last() if len(frame) else frame["value"]
            pending = float(newest.sum()) if len(newest) else 0.0
            prov["gpus_pending"] = f"metric /v1/aggregates {meter.metric} ({meter.aggregation})"
            if not len(newest):
                notes.append(f"gpu_pending: Gnocchi has no point of {meter.metric} in {window}; read as 0")
        return pressure_from_records(self.platform, at, records, pending=pending, provenance=prov, notes=notes)

    # -------------------------------------------------------------- usage
    def usage(self, start: datetime, end: datetime, step: str = "5min") -> pd.DataFrame:
        """History of the configured meters from Gnocchi for `[start, end)`, one point per step.

        `step` must be a granularity of the meters' archive policy. Beside each meter's rows,
        its health series (`gnocchi_health`): the measures missing at that granularity.
        Raises SourceError when no meter is configured or the cloud has no metric service
        (no history to read).
        """
        window = format_window(start, end)
        if not self.gnocchi_meters:
            raise SourceError(self.platform, "metric (gnocchi)", window,
                              "no Gnocchi meters configured: Placement keeps no usage history")
        step_s = step_seconds(step)
        grid = aligned_points(start, end, step_s)
        if grid is None:
            return empty_samples()
        parts = []
        for metric, meter in self.gnocchi_meters.items():
            payload = self._gnocchi_aggregates(meter, grid[0], as_utc(end), step_s, window)
            rows = gnocchi_groups_to_frame(payload, self.platform, self.cluster, metric, meter, window)
            rows = rows[(rows["ts"] >= grid[0]) & (rows["ts"] <= grid[1])]
            parts += [rows, gnocchi_health(rows, self.platform, self.cluster, metric, grid, step_s)]
        parts = [p for p in parts if len(p)]
        if not parts:
            return empty_samples()
        frame = pd.concat(parts, ignore_index=True)
        try:
            return normalize_samples(frame, where=f"{self.platform} gnocchi [{window}]")
        except CanonicalFrameError as exc:
            raise SourceError(self.platform, "metric /v1/aggregates", window, str(exc)) from exc

    def _gnocchi_aggregates(self, meter: GnocchiMeter, first: datetime, end: datetime, step_s: int,
                            window: str) -> Any:
        params = {
            "start": first.isoformat(),
            "stop": end.isoformat(),
            "granularity": step_s,
            "groupby": meter.group_by,
            "fill": "null",
        }
        # `(aggregate ...)` is what makes Gnocchi answer one "aggregated" series per group;
        # a bare `(metric ...)` answers per resource id instead. `resource_type` belongs in the
        # body: without it Gnocchi takes the metric names for metric ids (HTTP 400).
        agg = meter.aggregation
        body = {"operations": f"(aggregate {agg} (metric {meter.metric} {agg}))",
                "resource_type": meter.resource_type, "search": {}}

        def post() -> Any:
            resp = self._conn.session.post(
                "/v1/aggregates",
                endpoint_filter={"service_type": "metric", "interface": self.interface,
                                 "region_name": self.region_name},
                params=params, json=body, raise_exc=False,
                headers={"Accept": "application/json"},
            )
            if resp.status_code in (400, 404):
                # Gnocchi says which part of the meter it refuses (an attribute the resource type
                # lacks, an unknown metric or type, a granularity outside the archive policy)
                raise PermanentError(f"HTTP {resp.status_code}: {_gnocchi_reason(resp)}")
            _raise_for_status(resp.status_code)
            try:
                return resp.json()
            except ValueError as exc:
                raise PermanentError("malformed payload: not JSON") from exc

        return self._call("metric /v1/aggregates", window, post)


def gnocchi_groups_to_frame(
    payload: Any, platform: str, cluster: str, metric: str, meter: GnocchiMeter, window: str
) -> pd.DataFrame:
    """Canonical rows from a grouped `/v1/aggregates` answer.

    The answer is a list of `{"group": {attr: value}, "measures": {"measures":
    {"aggregated": [[iso_ts, granularity, value], ...]}}}`; null values (gaps) are dropped.
    """
    unit = meter.unit or CANONICAL_METRICS.get(metric, "")
    rows = []
    try:
        for group in payload:
            entity = str(group["group"][meter.group_by])
            measures = group["measures"]["measures"]
            points = measures.get("aggregated") if isinstance(measures, dict) else None
            if points is None:
                raise KeyError("aggregated")
            for ts, _gran, value in points:
                if value is None:
                    continue
                rows.append((platform, cluster, meter.entity_kind, entity, metric, ts, float(value) * meter.scale, unit))
    except (KeyError, TypeError, ValueError) as exc:
        raise SourceError(platform, "metric /v1/aggregates", window,
                          f"malformed payload for {meter.metric} ({type(exc).__name__}: {exc})") from exc
    frame = pd.DataFrame(rows, columns=["platform", "cluster", "entity_kind", "entity_id", "metric", "ts", "value",
                                        "unit"])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame


def gnocchi_health(
    rows: pd.DataFrame, platform: str, cluster: str, metric: str, grid: tuple[datetime, datetime], step_s: int
) -> pd.DataFrame:
    """The health series of one meter's canonical ``rows`` (one group per ``entity_id``) on the
    grid ``grid`` = (first, last) instants at the archive policy's granularity ``step_s``.

    At each step: ``health_up`` 0 where a measure is missing, i.e. no group has one there or a
    group lacks one between its first and last measure of the window; 1 elsewhere. And
    ``health_sample_age_seconds``: how far the newest measure lags the step (0 where it is
    there), the worst of the groups whose measures span the step, or else the newest of any.
    A group's steps before its first or after its last measure are no gap of its own: a
    compute node that joined or left the cloud in the window (the grouped answer does not say
    which) has no measure there either; steps where every group is silent are. A meter with no
    measure in the window stages no health (nothing read, nothing to vouch for). One health
    series per meter (entity kind ``HEALTH_ENTITY_KIND``, entity id ``health_target(metric)``).
    """
    if rows.empty:
        return pd.DataFrame()
    first = pd.Timestamp(grid[0])
    n = int((pd.Timestamp(grid[1]) - first).total_seconds() // step_s) + 1
    groups = sorted(rows["entity_id"].unique())
    at = ((rows["ts"] - first).dt.total_seconds() // step_s).to_numpy(int)
    have = np.zeros((len(groups), n), dtype=bool)
    have[np.searchsorted(groups, rows["entity_id"].to_numpy()), at] = True
    steps = np.arange(n)
    newest = np.maximum.accumulate(np.where(have, steps, -1), axis=1)  # each group's newest step <= t
    began = np.maximum.accumulate(have, axis=1)
    ended = np.maximum.accumulate(have[:, ::-1], axis=1)[:, ::-1]
    spans = began & ended  # the step lies between the group's first and last measure
    up = have.any(axis=0) & ~(spans & ~have).any(axis=0)
    lag = np.where(newest >= 0, steps - newest, -1)
    inside = np.where(spans, lag, -1).max(axis=0)
    # where no group's measures span the step, the newest measure of any group is the meter's
    freshest = np.where(lag >= 0, lag, n).min(axis=0)
    outside = np.where(freshest < n, freshest, -1)
    worst = np.where(spans.any(axis=0), inside, outside).astype(float) * step_s
    ts = pd.date_range(first, periods=n, freq=f"{step_s}s")
    known = worst >= 0
    out = [("health_up", ts, up.astype(float)), ("health_sample_age_seconds", ts[known], worst[known])]
    return pd.concat([pd.DataFrame({
        "platform": platform, "cluster": cluster, "entity_kind": HEALTH_ENTITY_KIND,
        "entity_id": health_target(metric), "metric": name, "ts": when, "value": values,
        "unit": HEALTH_METRICS[name]}) for name, when, values in out], ignore_index=True)


def _gnocchi_reason(resp: Any) -> str:
    """Gnocchi's `description` of a refused request, on one line and at most 200 characters."""
    try:
        desc = resp.json().get("description", "")
    except (ValueError, AttributeError):
        desc = ""
    if isinstance(desc, dict):
        desc = "; ".join(str(desc[k]) for k in ("cause", "reason", "detail") if k in desc)
    text = " ".join(str(desc).split()) or "refused"
    return text if len(text) <= 200 else text[:197] + "..."


def _raise_for_status(status: int) -> None:
    if status < 400:
        return
    if status in (401, 403):
        raise PermanentError(f"authentication refused (HTTP {status})")
    if status in (408, 429) or status >= 500:
        raise TransientError(f"HTTP {status}")
    raise PermanentError(f"HTTP {status}")


def _classified(fn: Callable[[], Any], timeout: float) -> Any:
    """Run one SDK call, turning its exceptions into Transient/PermanentError without their text.

    SDK and keystoneauth messages can carry request URLs and response bodies; the
    reason built here names only the kind of failure and the status code.
    """
    try:
        return fn()
    except (TransientError, PermanentError):
        raise
    except ksa_exc.Unauthorized as exc:
        raise PermanentError("authentication refused (HTTP 401)") from exc
    except ksa_exc.Forbidden as exc:
        raise PermanentError("authentication refused (HTTP 403)") from exc
    except (ksa_exc.EndpointNotFound, sdk_exc.ServiceDisabledException, sdk_exc.EndpointNotFound) as exc:
        raise PermanentError("service not in the service catalog") from exc
    except (ksa_exc.ConnectTimeout, ksa_exc.RequestTimeout, ksa_exc.GatewayTimeout) as exc:
        raise TransientError(f"no answer within {timeout}s") from exc
    except ksa_exc.ConnectFailure as exc:
        raise TransientError("connection refused") from exc
    except ksa_exc.HttpError as exc:
        _raise_for_status(exc.http_status or 500)
        raise PermanentError(f"HTTP {exc.http_status}") from exc
    except sdk_exc.HttpException as exc:
        code = exc.status_code or 500
        _raise_for_status(code)
        raise PermanentError(f"HTTP {code}") from exc
    except (ksa_exc.ClientException, sdk_exc.SDKException) as exc:
        raise PermanentError(f"{type(exc).__name__}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise PermanentError(f"malformed payload ({type(exc).__name__})") from exc
