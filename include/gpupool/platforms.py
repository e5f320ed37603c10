"""From a platform's configuration to the source that extracts from it and the actuator that
moves its nodes — the one place that does so, with one connection lookup for both.

The real platforms are reached through their APIs (`gpupool.sources`, the actuators in
`gpupool.actuation.actuators`). A platform's `conn_id` names an Airflow connection: inside a task
the DAG passes Airflow's own lookup in (`lookup(conn_id)`, so this package never imports
Airflow); outside Airflow it is `AIRFLOW_CONN_<CONN_ID>` in the environment, as a URI or JSON.
Errors name the platform and the connection id, never any part of the connection.

The embedded default (`kind: simulator`) reads the virtual datacenter's world in process, so
`make demo` and the DAG tests run with no service at all; its actuator
(`gpupool.sim.actuator.WorldActuator`) acts on a World the caller holds.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
import functools
from functools import lru_cache
from typing import Any, Mapping

import pandas as pd

from gpupool.actuation.actuators.base import ActuationConfigError, with_pool_names
from gpupool.actuation.power.base import PowerActuator
from gpupool.config import GpupoolConfig, PlatformConfig
from gpupool.sources.base import Pressure, SourceError, pressure_from_records
from gpupool.values import utc_datetime

#: the embedded world is generated per calendar quarter (plus this much history before it),
#: so every window inside a quarter sees the same, reproducible world
_LEAD = timedelta(days=35)


class EmbeddedWorldSource:
    """A platform of the embedded virtual datacenter, read in process."""

    def __init__(self, platform: str, seed: int = 0):
        self.platform = platform
        self.seed = seed

    def _world(self, until: datetime):
        start, end = _quarter_span(pd.Timestamp(until) - pd.Timedelta(microseconds=1))
        return _embedded_world(start.isoformat(), end.isoformat(), self.seed)

    def usage(self, start: datetime, end: datetime, step: str = "5min") -> pd.DataFrame:
        """Canonical samples of [start, end) as the platform's metrics APIs would report them."""
        world = self._world(end)
        if pd.Timestamp(start) < world.start:
            raise ValueError(
                f"platform {self.platform}: the embedded world starts at {world.start.isoformat()}, "
                f"window starts {pd.Timestamp(start).isoformat()}"
            )
        return world.samples(self.platform, start, end)

    def inventory(self, at: datetime) -> list[dict]:
        world = self._world(at)
        return [
            {
                "node": n["name"],
                "gpus": n["gpus"],
                "gpu_model": n["gpu_model"],
                "mig_layout": {"config": n["mig_layout"]} if n.get("mig_layout") else None,
                "schedulable": n["schedulable"],
                "drain_reason": n["drain_reason"] or None,
                "busy_gpus": n["busy_gpus"],
            }
            for n in world.inventory(self.platform, at)
        ]


    def pressure(self, at: datetime) -> Pressure:
        """Pressure at ``at`` as the world's platform would report it to an instant read: node
        states from its inventory (which nodes are open, which idle), allocated and pending GPUs
        from its exporter's newest sample before ``at`` (the step that just ended, exporter
        faults included, as :meth:`usage` reports it). Where the exporter has no row for that
        step (a gap) allocation comes from the inventory's busy GPUs and pending reads 0, and
        ``notes`` says so, like a real source whose exporter answered no series."""
        at = utc_datetime(at)
        world = self._world(at)
        i = int((pd.Timestamp(at) - world.start) // world.step)
        if i < 1 or i > len(world.index):
            raise ValueError(f"platform {self.platform}: no embedded world step ends before {at.isoformat()} "
                             f"(the world spans [{world.start.isoformat()}, {world.end.isoformat()}))")
        records = self.inventory(at)
        _, reported, kept = world.demand_telemetry(self.platform, i - 1, i)
        where = f"embedded world {self.platform} (seed {self.seed}), step {world.index[i - 1].isoformat()}"
        prov = {"nodes": f"{where}: inventory", "gpus_capacity": f"{where}: open nodes' GPUs"}
        notes: list[str] = []
        allocated = None
        if kept[0]:
            allocated = float(reported["gpu_allocated"][0])
            pending = float(reported["gpu_pending"][0])
            prov["gpus_allocated"] = prov["gpus_pending"] = f"{where}: exporter sample"
        else:
            pending = 0.0
            notes.append(f"the exporter has no sample for the step before {at.isoformat()}: allocation from the "
                         "inventory's busy GPUs, pending read as 0")
            prov["gpus_allocated"] = f"{where}: inventory busy GPUs"
            prov["gpus_pending"] = "none (exporter gap)"
        return pressure_from_records(self.platform, at, records, pending=pending, provenance=prov, notes=notes,
                                     allocated=allocated)


def _quarter_span(ts: pd.Timestamp) -> tuple[pd.Timestamp, pd.Timestamp]:
    q = ts.tz_convert("UTC").tz_localize(None).to_period("Q")
    start = q.start_time.tz_localize("UTC") - _LEAD
    end = (q + 1).start_time.tz_localize("UTC")
    return start, end


@lru_cache(maxsize=4)
def _embedded_world(start: str, end: str, seed: int):
    from gpupool.sim.world import default_world

    return default_world(start, end, seed=seed)


def platform_connection(pcfg: PlatformConfig, lookup=None, env: Mapping[str, str] | None = None):
    """The connection of one platform (a :class:`gpupool.sources.factory.Conn`).

    ``lookup(conn_id)`` is Airflow's connection lookup inside a task; without it the connection
    is ``AIRFLOW_CONN_<CONN_ID>`` of ``env`` (default: the process environment). A missing
    ``conn_id`` or connection, or one that cannot be parsed, raises
    :class:`~gpupool.sources.factory.ConnectionError_` naming the platform and the id only.
    """
    from gpupool.sources.factory import ConnectionError_, lookup_connection

    if not pcfg.conn_id:
        raise ConnectionError_(f"platform {pcfg.name!r} ({pcfg.kind}) has no conn_id")
    try:
        return lookup_connection(pcfg.conn_id, lookup, os.environ if env is None else env)
    except ConnectionError_ as exc:
        raise ConnectionError_(f"platform {pcfg.name!r}: {exc}") from None


def build_source(pcfg: PlatformConfig, cfg: GpupoolConfig, lookup=None, env: Mapping[str, str] | None = None):
    """The source object for one configured platform; `lookup(conn_id)` is Airflow's
    connection lookup inside a task, else connections come from the environment."""
    if pcfg.kind == "simulator":
        return EmbeddedWorldSource(pcfg.name, seed=cfg.simulator.seed)
    from gpupool.sources.factory import source_for

    return _naming_connection(source_for(pcfg, platform_connection(pcfg, lookup, env)), pcfg.conn_id)


#: the reads the stages make of a source: a SourceError out of them names the connection's id
_SOURCE_READS = ("usage", "inventory", "pressure", "node_names")


def _naming_connection(source, conn_id: str):
    """``source`` whose reads raise their SourceError naming the platform's connection by its
    id, never its address (the sources name the endpoint they asked; the user configured an id)."""
    def named(read):
        @functools.wraps(read)
        def call(*args, **kwargs):
            try:
                return read(*args, **kwargs)
            except SourceError as exc:
                raise exc.naming(conn_id) from exc

        return call

    for name in _SOURCE_READS:
        read = getattr(source, name, None)
        if callable(read):
            setattr(source, name, named(read))
    return source


def build_actuator(pcfg: PlatformConfig, cfg: GpupoolConfig, lookup=None, env: Mapping[str, str] | None = None,
                   world=None):
    """The actuator of one configured platform, from the same connection as its source.

    Connection fields the actuators read (besides host/login/password):

    * slurm: ``extra.slurm_conf`` (else ``$SLURM_CONF``), optional ``extra.bin_dir``; with
      ``extra.restd_url`` (+ ``restd_user``/``restd_token``) node state and jobs are read through
      slurmrestd, drain/resume still through ``scontrol`` (22.05's slurmrestd cannot update nodes);
      ``extra.mig_command``: the node-side MIG command (an argv template with ``{node}`` and
      ``{layout}``), without which Slurm nodes are never re-laid out;
    * openstack: ``extra.cloud`` (a clouds.yaml entry) or ``host`` (auth URL), ``login``,
      ``password``, ``extra.project_name``/``user_domain_name``/``project_domain_name``/
      ``region_name``; ``extra.manage_compute_service`` (default true);
    * kubernetes: ``extra.kubeconfig`` (+ ``extra.context``), ``extra.in_cluster: true``, or
      ``host`` + ``password`` (bearer token) + ``extra.ca_cert``/``verify``;
    * simulator: no connection; ``world`` is the :class:`~gpupool.sim.world.World` to act on
      (the embedded world is rebuilt on every run, so there is none to act on by default).

    The actuator speaks pool node ids: :func:`with_pool_names` maps them to this platform's own
    names (``pool.nodes[].names``).
    """
    from gpupool.actuation.actuators.base import ActuationConfigError

    if pcfg.kind == "simulator":
        if world is None:
            raise ActuationConfigError(
                f"platform {pcfg.name!r} (simulator): the embedded world is rebuilt on every run; "
                "pass the World to act on")
        from gpupool.sim.actuator import WorldActuator

        return with_pool_names(cfg, {pcfg.name: WorldActuator(world, pcfg.name)})[pcfg.name]
    conn = platform_connection(pcfg, lookup, env)
    env = os.environ if env is None else env
    x = conn.extra
    if pcfg.kind == "slurm":
        from gpupool.actuation.actuators.slurm import SlurmActuator

        conf = x.get("slurm_conf") or env.get("SLURM_CONF")
        if not conf:
            raise ActuationConfigError(
                f"platform {pcfg.name!r}: no slurm_conf in connection {pcfg.conn_id!r} and no SLURM_CONF")
        act = SlurmActuator(pcfg.name, slurm_conf=conf, bin_dir=x.get("bin_dir"), restd_url=x.get("restd_url"),
                            restd_user=x.get("restd_user"), restd_token=x.get("restd_token"),
                            mig_command=x.get("mig_command"))
    elif pcfg.kind == "openstack":
        import openstack

        if x.get("cloud"):
            os_conn = openstack.connect(cloud=x["cloud"])
        else:
            os_conn = openstack.connect(
                auth_url=conn.url(), username=conn.login, password=conn.password,
                project_name=x.get("project_name"), user_domain_name=x.get("user_domain_name", "Default"),
                project_domain_name=x.get("project_domain_name", "Default"),
                region_name=x.get("region_name"), load_envvars=False, load_yaml_config=False,
            )
        from gpupool.actuation.actuators.openstack import OpenStackActuator

        act = OpenStackActuator(os_conn, pcfg.name, manage_compute_service=_flag(x.get("manage_compute_service", True)))
    elif pcfg.kind == "kubernetes":
        from kubernetes import client, config as kconfig

        from gpupool.actuation.actuators.kubernetes import KubernetesActuator

        if _flag(x.get("in_cluster", False)):
            kconfig.load_incluster_config()
            api = client.ApiClient()
        elif x.get("kubeconfig"):
            api = kconfig.new_client_from_config(config_file=x.get("kubeconfig"), context=x.get("context"))
        else:
            kc = client.Configuration()
            kc.host = conn.url("https")
            if conn.password:
                kc.api_key = {"authorization": conn.password}
                kc.api_key_prefix = {"authorization": "Bearer"}
            kc.ssl_ca_cert = x.get("ca_cert")
            kc.verify_ssl = _flag(x.get("verify", True))
            api = client.ApiClient(kc)
        act = KubernetesActuator(api, pcfg.name, quota=pcfg.quota)
    else:  # pragma: no cover - PlatformKind is closed
        raise ActuationConfigError(f"platform {pcfg.name!r}: no actuator for kind {pcfg.kind!r}")
    return with_pool_names(cfg, {pcfg.name: act})[pcfg.name]


def build_actuators(cfg: GpupoolConfig, platforms: list[str] | None = None, lookup=None,
                    env: Mapping[str, str] | None = None, world=None) -> dict:
    """Actuators of the platforms configured with ``actuation: true`` (of ``platforms`` if
    given). Simulator platforms get one only when ``world`` is given."""
    out = {}
    for p in cfg.platforms:
        if platforms is not None and p.name not in platforms:
            continue
        if not p.actuation or (p.kind == "simulator" and world is None):
            continue
        out[p.name] = build_actuator(p, cfg, lookup, env, world)
    return out


def _flag(value: Any) -> bool:
    return str(value).strip().lower() not in ("false", "0", "no", "off", "")


# ------------------------------------------------------------------------------- power (parking)
# From a platform's ``power:`` configuration to its power actuator, and which parks are live:
# ``means: slurm`` is Slurm's own power saving over the platform's Slurm connection; ``redfish``
# the BMC user of ``bmc_conn_id`` (behind the Kubernetes cordon or the nova-compute hold, bare on
# Slurm); ``ironic`` the platform's own openstacksdk connection behind the nova-compute hold.


def pool_names(cfg: GpupoolConfig, platform: str) -> dict[str, str]:
    """Pool node id -> the platform's name, where they differ."""
    return {n.node: n.names[platform] for n in cfg.pool.nodes if n.names.get(platform, n.node) != n.node}


def is_live(cfg: GpupoolConfig, pcfg: PlatformConfig, dry_run: bool = True) -> bool:
    """Whether a park or wake on ``pcfg`` is really sent: the run is not a dry run, the
    configuration is not (``dry_run: false``), the platform actuates and has ``power:``."""
    return (not dry_run) and (not cfg.dry_run) and pcfg.actuation and pcfg.power is not None


def build_power_actuator(pcfg: PlatformConfig, cfg: GpupoolConfig, lookup=None,
                         env: Mapping[str, str] | None = None) -> PowerActuator:
    """The power actuator of one platform with ``power:``; ``lookup(conn_id)`` is Airflow's
    connection lookup inside a task, else connections come from the environment."""
    power = pcfg.power
    if power is None:
        raise ActuationConfigError(f"platform {pcfg.name!r} has no power: section; its nodes are never parked")
    names = pool_names(cfg, pcfg.name)
    if power.means == "slurm":
        from gpupool.actuation.power.slurm import SlurmPower

        return SlurmPower(_raw(build_actuator(pcfg, cfg, lookup, env)), names=names)
    if power.means == "ironic":
        from gpupool.actuation.power.holds import HeldPower, OpenStackHold
        from gpupool.actuation.power.ironic import IronicPower

        hold = _raw(build_actuator(pcfg, cfg, lookup, env))
        means = IronicPower(hold.conn, pcfg.name, ironic_node=power.ironic_node, power_off=power.power_off, names=names)
        return HeldPower(OpenStackHold(hold), means)
    from gpupool.actuation.power.redfish import RedfishPower

    bmc = _bmc_connection(pcfg, lookup, env)
    means = RedfishPower(pcfg.name, power.bmc_address, power.bmc_system, username=bmc.login, password=bmc.password,
                         verify=power.bmc_verify, power_off=power.power_off, names=names)
    if pcfg.kind == "kubernetes":
        from gpupool.actuation.power.holds import HeldPower, KubernetesHold

        return HeldPower(KubernetesHold(_raw(build_actuator(pcfg, cfg, lookup, env))), means)
    if pcfg.kind == "openstack":
        from gpupool.actuation.power.holds import HeldPower, OpenStackHold

        return HeldPower(OpenStackHold(_raw(build_actuator(pcfg, cfg, lookup, env))), means)
    return means


def build_power_actuators(cfg: GpupoolConfig, dry_run: bool = True, lookup=None,
                          env: Mapping[str, str] | None = None) -> dict[str, PowerActuator]:
    """The power actuators of the platforms whose parks and wakes are live (:func:`is_live`);
    a platform without one has its parks and wakes audited as dry runs."""
    return {p.name: build_power_actuator(p, cfg, lookup, env) for p in cfg.platforms if is_live(cfg, p, dry_run)}


def _raw(actuator):
    """The platform actuator under its pool-name mapping (the power layer maps names itself)."""
    return getattr(actuator, "inner", actuator)


def _bmc_connection(pcfg: PlatformConfig, lookup, env):
    import os

    from gpupool.sources.factory import ConnectionError_, lookup_connection

    conn_id = pcfg.power.bmc_conn_id
    try:
        return lookup_connection(conn_id, lookup, os.environ if env is None else env)
    except ConnectionError_ as exc:
        raise ActuationConfigError(f"platform {pcfg.name!r}: power.bmc_conn_id: {exc}") from None
