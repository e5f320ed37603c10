"""platforms.yaml -> typed configuration.

Connections (URLs, credentials) are never in this file: each platform names an Airflow
connection id, and outside Airflow the same id is read from `AIRFLOW_CONN_<ID>` in the
environment. A bad file fails with one message naming the file, the key and the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from gpupool import inputfiles, mig
from gpupool.errors import UserError, one_line, shown

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
            raise ValueError(f"unknown key {shown(key)}; known: {', '.join(model.model_fields)}") from None
        raise ValueError(f"{one_line(key, 100)}: {one_line(str(first['msg']))}") from None
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

#: the longest a duration of platforms.yaml's ``limits`` may be (a year, in hours): longer is
#: no operator's meaning, and beyond what a date's arithmetic can hold it breaks at run time
MAX_DURATION_HOURS = 24 * 366
#: the longest ``step`` may be: the pipeline reads hourly windows, and a longer step leaves
#: windows without a sample
MAX_STEP_SECONDS = 3600


#: an idle 8-GPU A100 server at the wall, about 1.4 kW: IPMI readings in the public AcmeTrace
#: data (Shanghai AI Lab, "Characterization of Large Language Model Development in the
#: Datacenter", NSDI '24); the what-if's default too. A platform's ``power.idle_watts`` overrides it
IDLE_WATTS = 1400.0
#: a powered-off server that keeps its BMC and power supplies in standby (what a park leaves):
#: tens of watts; an estimate, not a reading of the data above. ``power.parked_watts`` overrides it
PARKED_WATTS = 40.0

class ConfigError(UserError, ValueError):
    """A configuration file that cannot be used; the message names file, key and reason."""


def check_step(value: str) -> str:
    """``value`` (stripped) when it is a duration with a unit (``5min``, ``30s``, ``1h``; ``5m`` as
    Prometheus writes it) of a whole number of seconds from 1 to :data:`MAX_STEP_SECONDS`;
    else a ValueError saying why (what the sources, the pipeline and the collector read it as
    must be one step, so a bare number, whose unit they would read differently, is refused)."""
    import re
    import warnings

    import pandas as pd

    text = value.strip()
    if re.fullmatch(r"[+-]?[0-9.]+", text):
        raise ValueError(f"{shown(value)} has no unit; write e.g. 5min, 30s or 1h")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step = pd.Timedelta(re.sub(r"(?<=\d)m$", "min", text))
    except (ValueError, OverflowError):
        step = pd.NaT
    if step is pd.NaT:
        raise ValueError(f"{shown(value)} is not a duration such as 5min, 30s or 1h")
    seconds = step.total_seconds()
    if seconds <= 0 or seconds != int(seconds) or seconds > MAX_STEP_SECONDS:
        raise ValueError(f"{shown(value)}: give a whole number of seconds from 1s to {MAX_STEP_SECONDS // 3600}h")
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PowerConfig(_Strict):
    """How gpupool parks and wakes this platform's nodes (``power:``; absent: it never does).
    Each park and wake is audited, and sent only where the platform actuates (``actuation:
    true``) outside a dry run; see docs/operations/power.md."""

    means: Literal["slurm", "redfish", "ironic"] = Field(description=(
        "`slurm`: Slurm's own power saving (POWER_DOWN_ASAP / POWER_UP; slurm platforms only); "
        "`redfish`: each node's BMC; `ironic`: OpenStack's bare-metal service (openstack platforms only)"))
    bmc_address: str | None = Field(default=None, description=(
        "redfish: the BMC of each node, `{node}` (pool node id) and `{name}` (this platform's name "
        "of the node) filled in, e.g. https://{name}-bmc.mgmt.example"))
    bmc_system: str | None = Field(default=None, description=(
        "redfish: the node's ComputerSystem on its BMC, e.g. /redfish/v1/Systems/1; null: the only one"))
    bmc_conn_id: str | None = Field(default=None, description=(
        "redfish: the Airflow connection whose login and password are the BMC user"))
    bmc_verify: StrictBool = Field(default=True, description="redfish: verify the BMCs' TLS certificates")
    ironic_node: str = Field(default="{name}", description=(
        "ironic: the node's Ironic name or UUID, `{node}` / `{name}` filled in"))
    power_off: Literal["graceful", "force"] = Field(default="graceful", description=(
        "`graceful`: the operating system shuts down (Redfish GracefulShutdown, Ironic soft power "
        "off); `force`: power is cut (ForceOff, power off)"))
    timeout_minutes: float = Field(default=15.0, gt=0, le=MAX_DURATION_HOURS * 60, description=(
        "minutes a park or a wake may take before it is reported failed"))
    idle_watts: float = Field(default=IDLE_WATTS, ge=0, le=1e6, description=(
        "a powered, idle node's draw at the wall, in watts: the energy a parked hour saves is "
        "idle_watts - parked_watts (metrics and `gpupool report`; default an idle 8-GPU A100 server)"))
    parked_watts: float = Field(default=PARKED_WATTS, ge=0, le=1e6, description=(
        "a parked (powered-off) node's draw, in watts: its BMC and power supplies in standby"))

    @model_validator(mode="after")
    def _means_keys(self) -> "PowerConfig":
        if self.means == "redfish" and not (self.bmc_address and self.bmc_conn_id):
            raise ValueError("means redfish needs bmc_address and bmc_conn_id")
        if self.means != "redfish" and (self.bmc_address or self.bmc_system or self.bmc_conn_id):
            raise ValueError(f"bmc_* keys are for means redfish, not {self.means}")
        return self


#: A platform's ownership promises (docs/stages/ownership.md), one home for their defaults and
#: descriptions: platforms[] of platforms.yaml and a what-if scenario's platforms take the same
#: keys, and :class:`Ownership` gathers them for the plan and the fast path. The defaults promise
#: nothing, so a pool without them moves nodes as before
Owns = Annotated[int | None, Field(default=None, ge=0, description=(
    "how many of the nodes it holds it owns: the first N (by pool node id) of what it holds when "
    "gpupool first sees it, unless `pool.nodes[].owner` names an owner; null: none in platforms.yaml "
    "(a what-if scenario: every node it holds at the start)"))]
LendLimit = Annotated[int | None, Field(default=None, ge=0, description=(
    "the most of its owned nodes other platforms may hold at once; null: no limit, 0: it never lends"))]
BorrowLimit = Annotated[int | None, Field(default=None, ge=0, description=(
    "the most nodes owned by other platforms it may hold at once; null: no limit, 0: it never borrows"))]
ReclaimMinutes = Annotated[float | None, Field(default=None, gt=0, le=MAX_DURATION_HOURS * 60, description=(
    "the promise of a reclaim: when its work queues and a node it owns is lent out, that node comes back "
    "first, within this many minutes of the need (outside the move budget where the budget would make it "
    "later); null: no reclaim, its lent nodes come back only when the plan or the fast path moves them"))]
MinRuntimeMinutes = Annotated[float, Field(default=0.0, ge=0, le=MAX_DURATION_HOURS * 60, description=(
    "borrowed work on a node it lent runs at least this many minutes before a reclaim may end it; "
    "an idle lent node comes back at once"))]


class Ownership(_Strict):
    """One platform's ownership promises, as the plan, the fast path and the reclaim read them."""

    owns: Owns
    lend_limit: LendLimit
    borrow_limit: BorrowLimit
    reclaim_minutes: ReclaimMinutes
    min_runtime_minutes: MinRuntimeMinutes

    def promises(self) -> bool:
        """Whether it promises anything beyond the defaults (a limit or a reclaim)."""
        return any(getattr(self, k) != f.default for k, f in Ownership.model_fields.items() if k != "owns")


def ownership_of(spec: BaseModel) -> Ownership:
    """The :class:`Ownership` fields of a platform's configuration or scenario entry."""
    return Ownership(**{k: getattr(spec, k) for k in Ownership.model_fields})


#: a Kubernetes object name (DNS-1123 subdomain): a ClusterQueue's, a ResourceFlavor's, a KAI or Volcano Queue's
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: the queue kinds gpupool can tell
QUOTA_KINDS = ("kueue", "kai", "volcano")
#: the keys each queue kind takes (beside ``kind``) and those it requires
_QUOTA_KEYS = {"kueue": ({"cluster_queue", "flavor", "resource"}, {"cluster_queue", "flavor"}),
               "kai": ({"queue"}, {"queue"}),
               "volcano": ({"queue", "resource"}, {"queue"})}


class QuotaConfig(_Strict):
    """The queue whose quota follows the nodes gpupool moves on a Kubernetes platform (a Kueue
    ClusterQueue's ``nominalQuota``, a KAI-Scheduler Queue's GPU ``quota`` or a Volcano Queue's
    ``capability``: shrunk before a release drains a node, grown after an attach opens it;
    docs/stages/ownership.md)."""

    kind: str = Field(description=(
        "`kueue` (a ClusterQueue), `kai` (a KAI-Scheduler Queue) or `volcano` (a Volcano Queue)"))
    cluster_queue: str | None = Field(default=None, description=(
        "kueue (required): the ClusterQueue whose quota follows the nodes"))
    flavor: str | None = Field(default=None, description=(
        "kueue (required): the ResourceFlavor of the quota (a `spec.resourceGroups[].flavors[].name` of the ClusterQueue)"))
    queue: str | None = Field(default=None, description=(
        "kai (required): the Queue (`scheduling.run.ai/v2`) whose `spec.resources.gpu.quota` follows the nodes; "
        "volcano (required): the Queue (`scheduling.volcano.sh/v1beta1`) whose `spec.capability` of `resource` "
        "(and its `deserved` and `guarantee` of it, where set) follows the nodes"))
    resource: str = Field(default="nvidia.com/gpu", max_length=253,
                          pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
                          description=(
        "kueue and volcano: the resource whose quota changes by what each node reports allocatable of it "
        "(`nvidia.com/gpu`, or a MIG resource such as `nvidia.com/mig-1g.10gb`); a KAI queue counts "
        "GPU units as KAI does (a whole GPU 1, a `mig-<X>g.*` device X)"))

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in QUOTA_KINDS:
            raise ValueError(f"unknown queue kind {shown(value)}; supported: {', '.join(QUOTA_KINDS)}")
        return value

    @field_validator("cluster_queue", "flavor", "queue")
    @classmethod
    def _object_name(cls, value: str | None) -> str | None:
        import re

        if value is not None and (len(value) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, value)):
            raise ValueError(f"{shown(value)} is not a Kubernetes object name (lower-case letters, digits, '-' and '.')")
        return value

    @model_validator(mode="after")
    def _keys_of_the_kind(self) -> "QuotaConfig":
        takes, needs = _QUOTA_KEYS[self.kind]
        for key in sorted(needs):
            if getattr(self, key) is None:
                raise ValueError(f"quota.{key}: required for a {self.kind} queue")
        for key in sorted(self.model_fields_set - takes - {"kind"}):
            kinds = " or ".join(k for k in QUOTA_KINDS if key in _QUOTA_KEYS[k][0])
            raise ValueError(f"quota.{key}: only for a {kinds} queue, not {self.kind}")
        return self


class PlatformConfig(_Strict):
    """One platform instance gpupool extracts from and may actuate."""

    # staging's platform columns hold 64
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64, description=(
        "the platform's name in staging, plans, the pool page and the CLI"))
    kind: PlatformKind = Field(description=(
        "the API it is reached through; `simulator`: the embedded virtual datacenter"))
    conn_id: str | None = Field(default=None, description=(
        "the Airflow connection it is reached by (outside Airflow `AIRFLOW_CONN_<CONN_ID>` in the "
        "environment, a URI or JSON); required for every kind but `simulator`"))
    cluster: str = Field(default="", description="the cluster label its samples carry")
    metrics: dict[str, str | dict[str, str] | None] = Field(default_factory=dict, description=(
        "canonical metric -> query, overriding the source's defaults (for Slurm the Slurm and DCGM "
        "exporters', `gpupool.sources.slurm.DEFAULT_SLURM_QUERIES`). A PromQL string is a "
        "platform-wide series; a mapping {expr, entity_kind, entity, unit} names its entities; "
        "null drops a metric the deployment does not export. For OpenStack the value is the "
        "Gnocchi metric (Ceilometer meter) name or {metric, aggregation, group_by, entity_kind}"))
    actuation: StrictBool = Field(default=False, description=(
        "whether gpupool may move this platform's nodes; nothing is sent unless `dry_run` is false too"))
    min_nodes: int = Field(default=0, ge=0, description=(
        "the fewest nodes it holds, pool members or not (soft: bounds no plan can meet make it say "
        "`infeasible bounds: ...`, they are not refused)"))
    max_nodes: int | None = Field(default=None, ge=0, description=(
        "the most nodes it holds (at least `min_nodes`); null: no limit"))
    priority: float = Field(default=1.0, gt=0, description="the weight of its unmet demand in the plan")
    shard_nodes: int | None = Field(default=None, ge=1, description=(
        "extract the platform in parts of at most this many nodes, side by side (mapped tasks spread "
        "over the workers), plus one part for its platform-wide series; null: one part "
        "([operations/fleet.md](operations/fleet.md))"))
    prometheus_match: dict[str, str] = Field(default_factory=dict, description=(
        "label -> value every PromQL selector of the platform (the defaults and `metrics` alike) gets "
        "as a matcher, e.g. {cluster: slurm} where one Prometheus serves several clusters: each "
        "platform then reads only its own series (Slurm and Kubernetes platforms only)"))
    slice_profile: str | None = Field(default=None, description=(
        "the MIG slice profile this platform's users ask for (`1g.10gb`, ...): the plan counts its "
        "demand in slices and may lay the MIG-capable nodes it holds or receives out as "
        "`all-<profile>`; null: whole GPUs, MIG off on every node it holds. Slurm and Kubernetes "
        "only: refused on OpenStack (nova's mdev types are the host's configuration) and on "
        "`simulator` (a what-if scenario has its own `slice_profile`); a Slurm platform also needs "
        "its connection's `extra.mig_command` ([operations/real-platforms.md](operations/real-platforms.md))"))
    slice_demand: Literal["requests", "gpu_equivalent"] = Field(default="requests", description=(
        "with `slice_profile`, what its demand series count: `requests` (each GPU allocated or "
        "pending is one request of `slice_profile`: a job per whole GPU, or a slice per GRES, pod or "
        "DCGM instance on MIG nodes) or `gpu_equivalent` (GPUs' worth of work: each counts as "
        "`SLICES_PER_GPU` slices)"))
    power: PowerConfig | None = Field(default=None, description=(
        "how idle nodes are parked and woken (power off / on); null: never ([operations/power.md](operations/power.md))"))
    quota: QuotaConfig | None = Field(default=None, description=(
        "Kubernetes only: the queue whose quota follows the nodes gpupool attaches and releases, "
        "e.g. {kind: kueue, cluster_queue: team-a, flavor: h100, resource: nvidia.com/gpu}, "
        "{kind: kai, queue: team-a} or {kind: volcano, queue: team-a}; null: none"))
    owns: Owns
    lend_limit: LendLimit
    borrow_limit: BorrowLimit
    reclaim_minutes: ReclaimMinutes
    min_runtime_minutes: MinRuntimeMinutes

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
        if self.quota is not None and self.kind != "kubernetes":
            raise ValueError(f"quota: a {self.kind} platform has no Kubernetes queue (Slurm and OpenStack see the "
                             "drain and Placement's reserved)")
        if self.power is not None and (self.kind == "simulator" or (
                self.power.means in ("slurm", "ironic") and self.kind != {"slurm": "slurm", "ironic": "openstack"}[self.power.means])):
            raise ValueError(f"power.means: {self.power.means} cannot park the nodes of a {self.kind} platform")
        return self


class PoolNode(_Strict):
    """A node that belongs to the pool: it can be moved between platforms."""

    node: str = Field(description="the pool id: the name the planner and the handovers use")
    gpus: int = Field(gt=0, description="its GPUs")
    gpu_model: str = Field(default="", description="its GPU model, as the platforms report it")
    names: dict[str, str] = Field(default_factory=dict, description=(
        "platform -> the node's name there (default: `node`), e.g. {cloud: compute-gpu-a01.dc1, "
        "hpc: a01}; each key must be a configured platform, and a name given to two nodes is refused"))
    owner: str | None = Field(default=None, description=(
        "the platform that owns it (a configured platform), whichever holds it; null: the first N a "
        "platform's `owns` takes, else nobody's ([stages/ownership.md](stages/ownership.md))"))

    def name_on(self, platform: str) -> str:
        return self.names.get(platform, self.node)


class PoolConfig(_Strict):
    """The nodes that can move between platforms. The planner and the handovers speak the pool id
    (`node`); each platform hears only its own name, and inventory rows are mapped back to the
    pool id before planning."""

    nodes: list[PoolNode] = Field(default_factory=list, description="the member nodes (ids unique)")
    all_nodes: StrictBool = Field(default=True, description=(
        "when no explicit node list is given, every node the sources report is a member"))

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

    max_moves_per_decision: int = Field(default=4, ge=0, description=(
        "node moves per plan, and per rolling hour for the plan and the fast path together"))
    # chosen with bench/allocate_tune.py --cooldowns (tuning groupings): level across the grid
    cooldown_hours: float = Field(default=1.0, ge=0, le=MAX_DURATION_HOURS, description=(
        "hours a node that moved stays where it went before it may move again"))
    move_minutes: float = Field(default=30.0, ge=0, le=MAX_DURATION_HOURS * 60, description=(
        "minutes a move takes, in which the node serves nobody (the planner's cost of a move)"))
    # chosen with bench/allocate_tune.py --quantiles (tuning groupings, reactive)
    headroom_quantile: float = Field(default=0.95, gt=0.5, lt=1, description=(
        "the quantile of a platform's demand the plan counts as enough"))
    plan_horizon_hours: int = Field(default=PLAN_HORIZON_HOURS, ge=1, description=(
        "hours of demand the plan looks ahead (the first hours of the forecast; at most "
        "`horizon_hours`); `gpupool simulate` plans with the same default"))
    allow_evict: StrictBool = Field(default=False, description=(
        "whether a release may end running GPU work by the platform's own preemption (Kubernetes "
        "Eviction API, respecting PodDisruptionBudgets; Slurm `scontrol requeue`, the jobs keep their "
        "id and queue place; OpenStack live migration of the instances), and so whether "
        "the plan may choose a busy node; false: a busy node waits until its work ends. A refusal "
        "(a budget, a job that may not be requeued, no host to migrate to) makes the release wait"))

    def plan_limits(self) -> dict:
        """The limits alone, by name (what a :class:`gpupool.decisions.policy.Policy` takes)."""
        return {name: getattr(self, name) for name in PlanLimits.model_fields}


class LimitsConfig(PlanLimits):
    """The operator's planning and actuation limits: :class:`PlanLimits` (the planner's knobs,
    which :class:`gpupool.decisions.policy.Policy` shares) and the forecast's and actuation's own."""

    horizon_hours: int = Field(default=6, ge=1, le=MAX_DURATION_HOURS, description=(
        "hours the forecast stage forecasts (and validates its models on); `gpupool simulate` "
        "forecasts as far"))
    max_actuation_age_hours: float = Field(default=2.0, ge=0, le=MAX_DURATION_HOURS, description=(
        "a run whose window ended longer ago than this never actuates, and the fast path treats "
        "a plan older than this as no plan"))

    @model_validator(mode="after")
    def _plan_within_forecast(self) -> "LimitsConfig":
        if self.plan_horizon_hours > self.horizon_hours:
            raise ValueError(f"plan_horizon_hours ({self.plan_horizon_hours}) exceeds horizon_hours "
                             f"({self.horizon_hours}): the plan cannot look past the forecast")
        return self


class SimulatorConfig(_Strict):
    """The embedded virtual datacenter (used when a platform's kind is `simulator`)."""

    seed: int = Field(default=0, description="the seed of the demo world's synthetic demand and faults")
    history_days: int = Field(default=14, ge=1, le=MAX_DURATION_HOURS // 24, description=(
        "accepted but not read: the embedded world spans the calendar quarter of each window"))
    scenario: str | None = Field(default=None, description=(
        "accepted but not read: the embedded world is the demo world "
        "(`gpupool.sim.world.default_world`); `gpupool sim serve SCENARIO.yaml` serves a scenario's"))


class DetectConfig(_Strict):
    """Which series the pipeline cleans, and the router's settings (see `gpupool.detect.settings`)."""

    entity_kinds: list[str] = Field(default_factory=lambda: ["platform"], description=(
        "which series are cleaned: platform-level series feed the demand forecast; add `node` or "
        "`gpu` to clean those too"))
    router: dict = Field(default_factory=dict, description=(
        "the router's settings to override, e.g. {tau_multiplier: 5, overrides: {gpu_util: "
        "{detector: sr}}}; an unknown key is refused when the file is read"))

    @field_validator("router")
    @classmethod
    def _router(cls, value: dict) -> dict:
        from gpupool.detect.settings import RouterConfig

        return check_section(RouterConfig, value)

    def router_config(self):
        from gpupool.detect.settings import RouterConfig

        return RouterConfig(**self.router) if self.router else RouterConfig()


class NotifyConfig(_Strict):
    """Who is mailed when a pipeline run fails or a handover fails or is rolled back
    (`gpupool.notify`): off while `to` is empty. Mail goes out through the Airflow SMTP
    connection `smtp_conn_id`; `from_email` unset: the connection's own."""

    to: list[str] = Field(default_factory=list, description="the addresses mailed; empty: no mail")
    from_email: str | None = Field(default=None, description="the sender; null: the SMTP connection's own")
    smtp_conn_id: str = Field(default="smtp_default", description="the Airflow SMTP connection mail goes out through")

    @field_validator("to")
    @classmethod
    def _addresses(cls, to: list[str]) -> list[str]:
        bad = [a for a in to if "@" not in a.strip(" <>")]
        if bad:
            raise ValueError(f"not a mail address: {bad}")
        return to


class GpupoolConfig(_Strict):
    """A whole platforms.yaml."""

    platforms: list[PlatformConfig] = Field(description="the platforms gpupool extracts from and may actuate (names unique)")
    pool: PoolConfig = Field(default_factory=PoolConfig, description="the nodes that can move between platforms")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="the planning and actuation limits")
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig, description=(
        "the embedded virtual datacenter behind `simulator` platforms"))
    detect: DetectConfig = Field(default_factory=DetectConfig, description="anomaly detection and cleaning")
    notify: NotifyConfig = Field(default_factory=NotifyConfig, description="mail on failures")
    step: str = Field(default="5min", description=(
        "the sampling step of the staged series: a duration with a unit, whole seconds from 1 s to 1 h"))
    parking: dict = Field(default_factory=dict, description=(
        "the parking rule of the plan and the fast path (which idle nodes park, which parked "
        "nodes wake), for the platforms with `power:` only; its defaults are the what-if's"))
    dry_run: StrictBool = Field(default=True, description=(
        "true: nothing is sent anywhere. Actuation needs this false *and* the platform's "
        "`actuation: true` *and* a run that is no backfill; only a YAML boolean, a string such as "
        "\"off\" is refused"))

    @field_validator("step")
    @classmethod
    def _step(cls, value: str) -> str:
        return check_step(value)

    @field_validator("parking")
    @classmethod
    def _parking(cls, value: dict) -> dict:
        from gpupool.decisions.parking import ParkingSettings

        return check_section(ParkingSettings, value)

    def parking_settings(self):
        """``parking:`` as :class:`gpupool.decisions.parking.ParkingSettings`."""
        from gpupool.decisions.parking import ParkingSettings

        return ParkingSettings(**self.parking)

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

    @field_validator("pool")
    @classmethod
    def _pool_owners_are_platforms(cls, pool: PoolConfig, info: ValidationInfo) -> PoolConfig:
        """An ``owner`` must be a configured platform: a typo would leave the node nobody's."""
        known = [p.name for p in info.data.get("platforms") or []]
        for n in pool.nodes if known else ():
            if n.owner is not None and n.owner not in known:
                raise ValueError(f"nodes[{n.node}].owner: {n.owner!r} is not a configured platform; "
                                 f"platforms: {', '.join(known)}")
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
    raw = inputfiles.load_yaml(path, "platforms.yaml", inputfiles.MAX_CONFIG_BYTES, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    return parse_config(raw, source=str(path))


def parse_config(raw: dict, source: str = "<config>") -> GpupoolConfig:
    try:
        return GpupoolConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = one_line(_key_path(raw, err["loc"]), 120)
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{source}: key '{key}': {_message(err)}{more}") from None


def _message(err: dict) -> str:
    msg = one_line(str(err["msg"]).removeprefix("Value error, "))
    if err.get("type") == "bool_type":
        msg += f" (got {shown(err.get('input'))}; write true or false, unquoted)"
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
