"""platforms.yaml parsing: good files load, bad ones fail naming file, key and reason."""

from pathlib import Path

import pytest

from gpupool.config import ConfigError, default_config, load_config

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "platforms.example.yaml"


def test_example_file_loads():
    cfg = load_config(EXAMPLE)
    hpc = cfg.platform("hpc")
    assert hpc.kind == "slurm"
    assert "partition" in hpc.metrics["gpu_pending"]
    assert all(p.actuation is False for p in cfg.platforms)  # actuation off unless said
    assert cfg.dry_run is True
    assert cfg.pool.nodes[0].name_on("cloud") == "compute-gpu-a01.dc1"
    assert cfg.pool.nodes[1].name_on("cloud") == "gpu-a02"


def test_embedded_default_is_three_simulated_platforms():
    cfg = default_config()
    assert [p.name for p in cfg.platforms] == ["openstack", "slurm", "kubernetes"]
    assert {p.kind for p in cfg.platforms} == {"simulator"}


@pytest.mark.parametrize(
    "body, key, reason",
    [
        ("platforms:\n  - {name: hpc, kind: lsf}\n", "platforms[hpc].kind", "Input should be"),
        ("platforms:\n  - {name: hpc, kind: slurm, min_nodes: -1}\n", "platforms[hpc].min_nodes", "greater than or equal"),
        ("platforms:\n  - {name: hpc, kind: slurm, colour: red}\n", "platforms[hpc].colour", "Extra inputs"),
        ("platforms:\n  - {name: a, kind: slurm, conn_id: p}\n  - {name: a, kind: kubernetes, conn_id: k}\n", "platforms", "unique"),
        ("platforms:\n  - {name: a, kind: slurm, min_nodes: 5, max_nodes: 2}\n", "platforms[a]", "max_nodes"),
        ("platforms: []\n", "platforms", "at least one platform"),
        ("limits: {max_moves_per_decision: x}\nplatforms:\n  - {name: a, kind: slurm, conn_id: p}\n", "limits.max_moves_per_decision", "integer"),
        ("platforms:\n  - {name: a, kind: slurm, conn_id: p, prometheus_match: {'clu ster': a}}\n",
         "platforms[a].prometheus_match", "not a Prometheus label name"),
        ("platforms:\n  - {name: a, kind: openstack, conn_id: p, prometheus_match: {cluster: a}}\n",
         "platforms[a]", "not read from Prometheus"),
    ],
)
def test_bad_files_name_file_key_and_reason(tmp_path, body, key, reason):
    path = tmp_path / "platforms.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{key}'" in msg and reason in msg


def test_unreadable_and_non_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("platforms: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)


def test_compose_platforms_read_only_their_own_cluster():
    """One Prometheus (the vdc's) serves Slurm and Kubernetes in the compose deployment, its
    exporters labelling each series with `cluster` = the platform: every selector of every
    query a Prometheus-read platform runs, defaults included, must select its own cluster."""
    from gpupool.emulator.promql import parse, selectors
    from gpupool.sources.factory import queries_for

    cfg = load_config(EXAMPLE.parent / "compose" / "platforms.yaml")
    read = [p for p in cfg.platforms if p.kind in ("slurm", "kubernetes")]
    assert {p.name for p in read} == {"slurm", "kubernetes"}
    for pcfg in read:
        queries = [q for spec in queries_for(pcfg).values() for q in (spec if isinstance(spec, tuple) else (spec,))]
        assert len(queries) >= 4
        for q in queries:
            found = selectors(parse(q.expr))
            assert found, q.expr
            for sel in found:
                clusters = [(m.op, m.value) for m in sel.matchers if m.name == "cluster"]
                assert clusters == [("=", pcfg.name)], f"{pcfg.name}: {q.expr}"


def test_prometheus_match_reaches_default_and_configured_queries(tmp_path):
    from gpupool.sources.factory import queries_for

    path = tmp_path / "platforms.yaml"
    path.write_text("platforms:\n  - name: hpc\n    kind: slurm\n    conn_id: p\n"
                    "    prometheus_match: {cluster: west, site: a}\n"
                    "    metrics: {gpu_pending: 'sum(my_pending) / 2'}\n")
    queries = queries_for(load_config(path).platform("hpc"))
    util, job = queries["gpu_util"]  # a metric read by two queries keeps both
    assert util.expr == 'max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{cluster="west", site="a"})'
    assert util.node_label == "Hostname" and job.entity_kind == "job"
    assert job.expr == 'avg by (hpc_job) (DCGM_FI_DEV_GPU_UTIL{hpc_job!="", cluster="west", site="a"})'
    assert queries["gpu_pending"].expr == 'sum(my_pending{cluster="west", site="a"}) / 2'


def _quota(q: dict):
    from gpupool.config import parse_config

    return parse_config({"platforms": [{"name": "ai", "kind": "kubernetes", "conn_id": "k8s", "quota": q}]}).platforms[0].quota


def test_quota_kinds_take_their_own_keys():
    assert _quota({"kind": "kai", "queue": "team-ai"}).queue == "team-ai"
    kueue = _quota({"kind": "kueue", "cluster_queue": "team-ai", "flavor": "h100"})
    assert (kueue.cluster_queue, kueue.flavor, kueue.resource, kueue.queue) == ("team-ai", "h100", "nvidia.com/gpu", None)
    volcano = _quota({"kind": "volcano", "queue": "team-ai"})
    assert (volcano.kind, volcano.queue, volcano.resource) == ("volcano", "team-ai", "nvidia.com/gpu")
    assert _quota({"kind": "volcano", "queue": "team-ai", "resource": "nvidia.com/mig-1g.10gb"}).resource == "nvidia.com/mig-1g.10gb"


@pytest.mark.parametrize("q, message", [
    ({"kind": "kai"}, "quota.queue: required for a kai queue"),
    ({"kind": "kai", "queue": "team-ai", "flavor": "h100"}, "quota.flavor: only for a kueue queue"),
    ({"kind": "kai", "queue": "team-ai", "resource": "nvidia.com/gpu"}, "quota.resource: only for a kueue or volcano queue"),
    ({"kind": "kueue", "cluster_queue": "a", "flavor": "b", "queue": "c"}, "quota.queue: only for a kai or volcano queue"),
    ({"kind": "kueue", "flavor": "b"}, "quota.cluster_queue: required for a kueue queue"),
    ({"kind": "kai", "queue": "Team_AI"}, "'Team_AI' is not a Kubernetes object name"),
    ({"kind": "volcano"}, "quota.queue: required for a volcano queue"),
    ({"kind": "volcano", "queue": "a", "flavor": "h100"}, "quota.flavor: only for a kueue queue, not volcano"),
    ({"kind": "volcano", "queue": "a", "resource": "nvidia.com/ gpu"}, "quota.resource"),
    ({"kind": "yunikorn", "queue": "a"}, "unknown queue kind 'yunikorn'; supported: kueue, kai, volcano"),
])
def test_quota_refused_at_load_naming_the_key(q, message):
    with pytest.raises(ConfigError) as err:
        _quota(q)
    assert message in str(err.value) and "platforms[ai].quota" in str(err.value)
