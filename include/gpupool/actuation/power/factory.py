"""From a platform's ``power:`` configuration to its power actuator, and which parks are live.

* ``means: slurm`` (Slurm platforms): :class:`~gpupool.actuation.power.slurm.SlurmPower` over the
  platform's own Slurm connection (``slurm_conf``, ``bin_dir``, ``restd_url`` as for handovers);
* ``means: redfish``: :class:`~gpupool.actuation.power.redfish.RedfishPower` with the BMC user of
  ``bmc_conn_id`` (its login and password); on a Kubernetes platform behind the cordon, on an
  OpenStack platform behind the nova-compute hold (:mod:`~gpupool.actuation.power.holds`), on a
  Slurm platform bare (Slurm's own power saving is the better means there);
* ``means: ironic`` (OpenStack platforms): :class:`~gpupool.actuation.power.ironic.IronicPower`
  through the platform's own openstacksdk connection, behind the nova-compute hold.

Pool node ids are mapped to the platform's names (``pool.nodes[].names``). Errors name the
platform and connection ids, never any part of a connection.
"""

from __future__ import annotations

from typing import Mapping

from gpupool.actuation.power.base import PowerActuator
from gpupool.allocate.actuators.base import ActuationConfigError
from gpupool.config import GpupoolConfig, PlatformConfig


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
    from gpupool.platforms import build_actuator

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
