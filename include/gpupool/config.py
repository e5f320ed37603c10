"""platforms.yaml -> typed configuration.

Connections (URLs, credentials) are never in this file: each platform names an Airflow
connection id, and outside Airflow the same id is read from `AIRFLOW_CONN_<ID>` in the
environment. A bad file fails with one message naming the file, the key and the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from gpupool import mig
from gpupool.errors import UserError

PlatformKind = Literal["openstack", "slurm", "kubernetes", "simulator"]
#: the kinds reached through an API, whose connection `conn_id` names
CONNECTED_KINDS = ("openstack", "slurm", "kubernetes")


def check_section(model: type[BaseModel], value: dict) -> dict:
    """`value` unchanged if `model` accepts it, else a ValueError naming the first bad key
    (and, for an unknown key, the keys `model` knows)."""
    try:
        model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        if first["type"] == "extra_forbidden":
            raise ValueError(f"unknown key {key!r}; known: {', '.join(model.model_fields)}") from None
        raise ValueError(f"{key}: {first['msg']}") from None
    return value

#: hours of demand the plan looks ahead, in the pipeline (``limits.plan_horizon_hours``) and in
#: ``gpupool simulate`` (``Policy.plan_horizon_hours``) alike; chosen on the tuning groupings of
#: ``bench/allocate_helios.py`` (``bench/allocate_tune.py``, reactive). The forecast stage
#: forecasts further (``limits.horizon_hours``); the plan reads the first hours.
PLAN_HORIZON_HOURS = 2
#: the level (percent) of the demand forecast's prediction interval: the forecast task's,
#: ``gpupool forecast --level``'s and the what-if's default, and the plan's where a stored
#: forecast names none (here, beside the plan's horizon, so the pure decisions read it without
#: importing the forecaster)
FORECAST_LEVEL = 90.0

class ConfigError(UserError, ValueError):
    """A configuration file that cannot be used; the message names file, key and reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlatformConfig(_Strict):
    """One platform instance gpupool extracts from and may actuate."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64)  # staging's platform columns hold 64
    kind: PlatformKind
    conn_id: str | None = None
    cluster: str = ""
    #: canonical metric -> query, overriding the source's defaults (for Slurm: the Slurm and
    #: DCGM exporters, see `gpupool.sources.slurm.DEFAULT_SLURM_QUERIES`). A PromQL string is a
    #: platform-wide series; a mapping {expr, entity_kind, entity, unit} names its entities.
    #: null drops a metric the deployment does not export. For OpenStack the value is the
    #: Gnocchi metric (Ceilometer meter) name or {metric, aggregation, group_by, entity_kind}.
    metrics: dict[str, str | dict[str, str] | None] = Field(default_factory=dict)
    actuation: StrictBool = False
    min_nodes: int = Field(default=0, ge=0)
    max_nodes: int | None = Field(default=None, ge=0)
    priority: float = Field(default=1.0, gt=0)
    #: extract the platform in parts of at most this many nodes, side by side (mapped tasks
    #: spread over the workers), plus one part for its platform-wide series; null: one part
    shard_nodes: int | None = Field(default=None, ge=1)
    #: label -> value every PromQL query of the platform (the defaults and `metrics` alike)
    #: selects, e.g. {cluster: slurm} where one Prometheus serves several clusters: each
    #: platform then reads only its own series (Slurm and Kubernetes platforms only)
    prometheus_match: dict[str, str] = Field(default_factory=dict)
    #: the MIG slice profile this platform's users ask for (``1g.10gb``, ...): the plan counts its
    #: demand in slices and may lay MIG-capable nodes out as ``all-<profile>`` for it; absent:
    #: whole GPUs (MIG off on every node it holds)
    slice_profile: str | None = None
    #: what the platform's demand series count when it asks for slices: ``requests`` (each GPU
    #: allocated or pending is one request of ``slice_profile``: a job per whole GPU, or a slice
    #: per GRES/pod/DCGM instance on MIG nodes) or ``gpu_equivalent`` (GPUs' worth of work: each
    #: counts as ``SLICES_PER_GPU`` slices)
    slice_demand: Literal["requests", "gpu_equivalent"] = "requests"

    @field_validator("slice_profile")
    @classmethod
    def _known_profile(cls, value: str | None) -> str | None:
        return mig.check_profile(value)

    @field_validator("prometheus_match")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or k == "__name__"]
        if bad:
            raise ValueError(f"not a Prometheus label name: {bad[0]!r}")
        return value

    @model_validator(mode="after")
    def _limits(self) -> "PlatformConfig":
        if self.max_nodes is not None and self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes ({self.max_nodes}) < min_nodes ({self.min_nodes})")
        if self.kind in CONNECTED_KINDS and not self.conn_id:
            raise ValueError(f"conn_id: a {self.kind} platform needs one (the Airflow connection it is reached by)")
        if self.prometheus_match and self.kind not in ("slurm", "kubernetes"):
            raise ValueError(f"prometheus_match: a {self.kind} platform is not read from Prometheus")
        if self.slice_demand != "requests" and not self.slice_profile:
            raise ValueError("slice_demand: only a platform with a slice_profile counts its demand in slices")
        if self.slice_profile and self.kind == "simulator":
            raise ValueError("slice_profile: the virtual datacenter's platform APIs serve whole GPUs (a what-if "
                             "scenario's own slice_profile plans slices in `gpupool simulate`)")
        if self.slice_profile and self.kind == "openstack":
            raise ValueError("slice_profile: gpupool cannot lay out MIG on OpenStack hosts (nova's mdev types are "
                             "node-side configuration); leave it unset there")
        return self


class PoolNode(_Strict):
    """A node that belongs to the pool: it can be moved between platforms."""

    node: str
    gpus: int = Field(gt=0)
    gpu_model: str = ""
    #: the node's name on each platform (defaults to `node`)
    names: dict[str, str] = Field(default_factory=dict)

    def name_on(self, platform: str) -> str:
        return self.names.get(platform, self.node)


class PoolConfig(_Strict):
    nodes: list[PoolNode] = Field(default_factory=list)
    #: when no explicit node list is given, every node the sources report is a member
    all_nodes: StrictBool = True

    def node_id(self, platform: str, name: str) -> str:
        """The pool node id of the machine ``platform`` calls ``name`` (``name`` when unmapped)."""
        return self._by_platform_name().get((platform, name), name)

    def _by_platform_name(self) -> dict[tuple[str, str], str]:
        return {(p, alias): n.node for n in self.nodes for p, alias in n.names.items()}

    @model_validator(mode="after")
    def _unique_names(self) -> "PoolConfig":
        ids: set[str] = set()
        dup = sorted({n.node for n in self.nodes if n.node in ids or ids.add(n.node)})
        if dup:
            raise ValueError(f"pool node ids must be unique, repeated: {dup}")
        # On each platform a node answers to its alias there, else to its id: two nodes answering
        # to one name would be one machine to the sources and two to the plan. Only platforms
        # some node has an alias on can collide (elsewhere every name is a unique id).
        for p in sorted({p for n in self.nodes for p in n.names}):
            seen: dict[str, PoolNode] = {}
            for n in self.nodes:
                alias = n.name_on(p)
                other = seen.setdefault(alias, n)
                if other is not n:
                    def how(x: PoolNode) -> str:
                        return f"names.{p}" if p in x.names else "its node id"

                    raise ValueError(f"platform {p!r} name {alias!r} is given to two pool nodes: "
                                     f"{other.node!r} ({how(other)}) and {n.node!r} ({how(n)})")
        return self


class PlanLimits(_Strict):
    """The operator's limits the plan and the fast path obey, defined once: ``limits`` of
    platforms.yaml (:class:`LimitsConfig`) and the planner's :class:`gpupool.decisions.policy.Policy`
    both are this model, and the what-if scenario's defaults and the fast path's settings are read
    from it. The comment beside a default names the bench that chose it."""

    max_moves_per_decision: int = Field(
        default=4, ge=0, description="most node moves one plan may make, and both paths together in any rolling hour")
    # chosen with bench/allocate_tune.py --cooldowns (tuning groupings): level across the grid
    cooldown_hours: float = Field(default=1.0, ge=0, description="a moved node stays put this many hours")
    move_minutes: float = Field(default=30.0, ge=0, description="a moving node serves nobody for this long")
    # chosen with bench/allocate_tune.py --quantiles (tuning groupings, reactive)
    headroom_quantile: float = Field(
        default=0.95, gt=0.5, lt=1, description="the quantile the demand's `upper` numbers stand for")
    #: hours of demand the plan looks ahead (the first hours of the forecast); `gpupool simulate`
    #: plans with the same default (PLAN_HORIZON_HOURS)
    plan_horizon_hours: int = Field(
        default=PLAN_HORIZON_HOURS, ge=1, description="hours of demand the planner looks ahead")
    #: whether a release may evict running GPU work (Kubernetes Eviction API, respecting PDBs),
    #: and so whether the plan may choose a busy node; off: a busy node waits until its work ends
    allow_evict: StrictBool = Field(default=False, description="whether a node with running work may be released")

    def plan_limits(self) -> dict:
        """The limits alone, by name (what a :class:`gpupool.decisions.policy.Policy` takes)."""
        return {name: getattr(self, name) for name in PlanLimits.model_fields}


class LimitsConfig(PlanLimits):
    """The operator's planning and actuation limits: :class:`PlanLimits` (the planner's knobs,
    which :class:`gpupool.decisions.policy.Policy` shares) and the forecast's and actuation's own."""

    #: hours the forecast stage forecasts (and validates its models on); `gpupool simulate`
    #: forecasts as far (`sim.study.FORECAST_HOURS`)
    horizon_hours: int = Field(default=6, ge=1)
    max_actuation_age_hours: float = Field(default=2.0, ge=0)

    @model_validator(mode="after")
    def _plan_within_forecast(self) -> "LimitsConfig":
        if self.plan_horizon_hours > self.horizon_hours:
            raise ValueError(f"plan_horizon_hours ({self.plan_horizon_hours}) exceeds horizon_hours "
                             f"({self.horizon_hours}): the plan cannot look past the forecast")
        return self


class SimulatorConfig(_Strict):
    """The embedded virtual datacenter (used when a platform's kind is `simulator`)."""

    seed: int = 0
    history_days: int = Field(default=14, ge=1)
    scenario: str | None = None


class DetectConfig(_Strict):
    """Which series the pipeline cleans, and the router's settings (see `gpupool.detect.router`)."""

    #: platform-level series feed the demand forecast; add "node" or "gpu" to clean those too
    entity_kinds: list[str] = Field(default_factory=lambda: ["platform"])
    #: RouterConfig fields to override, e.g. {tau_multiplier: 5, overrides: {gpu_util: {detector: sr}}}:
    #: the operator's knobs (detector, tau_multiplier, fallback, spiky_detector, refit_every_hours,
    #: history_days, nonnegative, overrides); the benchmark-chosen rules sit in sections
    #: (routing, alarms, cleaning, sr, svr, prophet, zscore), e.g. {cleaning: {outage_max_idle_share: null}}
    router: dict = Field(default_factory=dict)

    @field_validator("router")
    @classmethod
    def _router(cls, value: dict) -> dict:
        from gpupool.detect.router import RouterConfig

        return check_section(RouterConfig, value)

    def router_config(self):
        from gpupool.detect.router import RouterConfig

        return RouterConfig(**self.router) if self.router else RouterConfig()


class NotifyConfig(_Strict):
    """Who is mailed when a pipeline run fails or a handover fails or is rolled back
    (`gpupool.notify`): off while `to` is empty. Mail goes out through the Airflow SMTP
    connection `smtp_conn_id`; `from_email` unset: the connection's own."""

    to: list[str] = Field(default_factory=list)
    from_email: str | None = None
    smtp_conn_id: str = "smtp_default"

    @field_validator("to")
    @classmethod
    def _addresses(cls, to: list[str]) -> list[str]:
        bad = [a for a in to if "@" not in a.strip(" <>")]
        if bad:
            raise ValueError(f"not a mail address: {bad}")
        return to


class GpupoolConfig(_Strict):
    platforms: list[PlatformConfig]
    pool: PoolConfig = Field(default_factory=PoolConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)
    detect: DetectConfig = Field(default_factory=DetectConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    step: str = "5min"
    #: only a YAML boolean (true/false): a string such as "off" is refused, not read as false
    dry_run: StrictBool = True

    @field_validator("pool")
    @classmethod
    def _pool_names_on_platforms(cls, pool: PoolConfig, info: ValidationInfo) -> PoolConfig:
        """A ``names:`` key must be a configured platform: a typo (``slrum``) would leave the node
        unmapped on the platform meant, silently."""
        platforms = [p.name for p in info.data.get("platforms") or []]
        if not platforms:  # the platforms failed validation: that error is the one to show
            return pool
        known = set(platforms)
        for n in pool.nodes:
            for key in n.names:
                if key not in known:
                    raise ValueError(f"nodes[{n.node}].names: {key!r} is not a configured platform; "
                                     f"platforms: {', '.join(platforms)}")
        return pool

    @field_validator("platforms")
    @classmethod
    def _unique(cls, platforms: list[PlatformConfig]) -> list[PlatformConfig]:
        if not platforms:
            raise ValueError("at least one platform is required")
        names = [p.name for p in platforms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"platform names must be unique, repeated: {dup}")
        return platforms

    def platform(self, name: str) -> PlatformConfig:
        for p in self.platforms:
            if p.name == name:
                return p
        raise ConfigError(f"no platform named {name!r}; configured: {[p.name for p in self.platforms]}")


def load_config(path: str | Path) -> GpupoolConfig:
    """Parse a platforms.yaml; raise ConfigError naming the file, key and reason."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    return parse_config(raw, source=str(path))


def parse_config(raw: dict, source: str = "<config>") -> GpupoolConfig:
    try:
        return GpupoolConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _key_path(raw, err["loc"])
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ConfigError(f"{source}: key '{key}': {_message(err)}{more}") from None


def _message(err: dict) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err.get("type") == "bool_type":
        msg += f" (got {err.get('input')!r}; write true or false, unquoted)"
    return msg


def _key_path(raw: dict, loc: tuple) -> str:
    """Render a pydantic location, naming list items by their `name` where they have one."""
    parts: list[str] = []
    node = raw
    for part in loc:
        if isinstance(part, int):
            label = f"[{part}]"
            if isinstance(node, list) and part < len(node) and isinstance(node[part], dict):
                name = node[part].get("name") or node[part].get("node")
                if name:
                    label = f"[{name}]"
            parts.append(label)
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            parts.append(("." if parts else "") + str(part))
            node = node.get(part) if isinstance(node, dict) else None
    return "".join(parts) or "<top>"


def default_config() -> GpupoolConfig:
    """The embedded default: three simulated platforms of the virtual datacenter."""
    return parse_config(
        {
            "platforms": [
                {"name": "openstack", "kind": "simulator", "min_nodes": 1},
                {"name": "slurm", "kind": "simulator", "min_nodes": 1},
                {"name": "kubernetes", "kind": "simulator", "min_nodes": 1},
            ]
        },
        source="<embedded default>",
    )
