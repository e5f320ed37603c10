"""Sharding a platform's extraction: node ranges, the PromQL that reads one range, and the
simulated Prometheus answering a range without building every other node's series."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from gpupool.pipeline import part_label, split_nodes
from gpupool.emulator.promql import Matcher, parse, parse_selector, selectors
from gpupool.sources.base import NodeShard
from gpupool.sources.prometheus import MetricQuery, node_regex, shard_queries, with_label_matcher
from gpupool.sources.slurm import DEFAULT_SLURM_QUERIES


@pytest.mark.parametrize("n,per", [(1, 1), (7, 3), (9, 3), (10, 4), (12_500, 1000), (999, 1000), (1001, 1000)])
def test_split_nodes_covers_every_node_exactly_once(n, per):
    rng = random.Random(n)
    names = [f"node-{i:05d}" for i in range(n)]
    shuffled = names + rng.sample(names, min(n, 5))  # listed twice: still one range each
    rng.shuffle(shuffled)
    ranges = split_nodes(shuffled, per)
    flat = [x for r in ranges for x in r]
    assert flat == sorted(names)  # each node once, ranges consecutive in name order
    sizes = [len(r) for r in ranges]
    assert max(sizes) <= per and max(sizes) - min(sizes) <= 1
    assert len(ranges) == -(-n // per)


def test_split_nodes_refuses_a_shard_of_no_nodes():
    assert split_nodes([], 3) == []
    with pytest.raises(ValueError, match="nodes per shard must be >= 1"):
        split_nodes(["a"], 0)


def test_part_labels_name_the_range_and_differ_when_its_nodes_do():
    a = part_label(0, 3, ("n1", "n2", "n3"))
    b = part_label(0, 3, ("n1", "n2b", "n3"))
    assert a.startswith("1/3 n1..n3 (3 nodes) #") and a != b
    assert part_label(2, 3, None) == "3/3 platform-wide"
    assert len(part_label(0, 2, ("x" * 200, "y" * 200))) <= 160  # fits extract_run.part


@pytest.mark.parametrize("expr", [
    "sum by (node) (slurm_gpus_total)",
    "max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) * 1048576",
    'avg by (hpc_job) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})',
    'count by (Hostname) (DCGM_FI_DEV_GPU_UTIL{pod!="", })',
    "sum(slurm_gpus_alloc) / 8",
    'sum without (gpu) ({__name__="DCGM_FI_DEV_GPU_UTIL"})',
])
def test_every_selector_gets_the_node_matcher_and_still_parses(expr):
    names = ["gpu-n1", "a.b+c", 'q"uote']
    out = with_label_matcher(expr, "Hostname", "=~", node_regex(names))
    found = selectors(parse(out))
    assert len(found) == len(selectors(parse(expr))) >= 1
    for sel in found:
        added = [m for m in sel.matchers if m.name == "Hostname"]
        assert len(added) == 1 and added[0].op == "=~"
        assert all(added[0].matches({"Hostname": n}) for n in names)
        assert not added[0].matches({"Hostname": "a.bxc"}) and not added[0].matches({"Hostname": "gpu-n10"})


def test_grouping_labels_functions_and_strings_are_left_alone():
    out = with_label_matcher('sum by (node) (rate(foo{a="sum(x)"}[5m] offset 1h)) > bool 2e3', "node", "=", "n1")
    assert out == 'sum by (node) (rate(foo{a="sum(x)", node="n1"}[5m] offset 1h)) > bool 2e3'
    out = with_label_matcher('sum by (namespace) (x * on (namespace, pod) group_left () y)', "node", "=", "n1")
    assert out == 'sum by (namespace) (x{node="n1"} * on (namespace, pod) group_left () y{node="n1"})'
    with pytest.raises(ValueError, match="not a label matcher"):
        with_label_matcher("x", "bad-label", "=", "v")


def test_a_shard_reads_the_node_queries_of_its_nodes_and_the_rest_reads_the_others():
    queries = [q for qs in DEFAULT_SLURM_QUERIES.values() for q in (qs if isinstance(qs, tuple) else (qs,))]
    node_q = [q for q in queries if q.node_label]
    other_q = [q for q in queries if not q.node_label]
    assert node_q and other_q
    shard = shard_queries(queries, NodeShard(("n1", "n2")))
    assert [q.entity for q in shard] == [q.entity for q in node_q]
    assert all(re.search(r'(node|Hostname)=~"n1\|n2"', q.expr) for q in shard)
    assert shard_queries(queries, NodeShard(None)) == other_q
    assert shard_queries(queries, NodeShard(())) == []
    assert shard_queries(queries, None) == queries


def test_a_matcher_naming_many_literals_matches_as_the_regex_does():
    rng = random.Random(1)
    names = [f"n-{i}.x" for i in range(500)]
    pattern = node_regex(names)
    probes = names[:50] + ["n-1", "n-1.xx", "n-10", "zzz", "", "n-1Ax"] + [rng.choice(names) + "0" for _ in range(20)]
    for op in ("=~", "!~"):
        fast = Matcher("Hostname", op, pattern)
        for probe in probes:
            hit = re.fullmatch(pattern, probe) is not None
            assert fast.matches({"Hostname": probe}) == (hit if op == "=~" else not hit), probe
    # a real regex is still a regex
    assert Matcher("h", "=~", "n-(1|2).*").matches({"h": "n-2abc"})
    assert not Matcher("h", "=~", "n-1|n-2").matches({"h": "n-12"})


def test_the_simulated_prometheus_answers_a_node_range_as_a_filter_of_the_whole(tmp_path):
    import yaml

    from gpupool.emulator.prometheus import SeriesStore
    from gpupool.emulator.serve import make_state

    spec = {"step": "5min", "decision_every": "1h", "node_gpus": 2, "move_minutes": 30, "max_moves_per_decision": 2,
            "start": "2026-01-01T00:00:00Z", "end": "2026-01-01T12:00:00Z", "seed": 2,
            "platforms": {"slurm": {"synthetic": {"base": 8, "total_gpus": 12}, "nodes": 6},
                          "kubernetes": {"synthetic": {"base": 5, "total_gpus": 8}, "nodes": 4}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    state = make_state(tmp_path / "s.yaml", speed=0, start_at="2026-01-01T06:00:00Z")
    store = SeriesStore(state)
    instants = state.world.start.timestamp() + 3600 * 5 + 300 * np.arange(12)
    names = sorted(n.name for n in state.world.nodes)[2:7]
    regex = node_regex(names)
    for family, label in (("DCGM_FI_DEV_GPU_UTIL", "Hostname"), ("slurm_gpus_alloc", "node")):
        every = [(lab, v) for lab, v in store.resolve(parse_selector(family), instants) if lab.get(label) in names]
        some = store.resolve(parse_selector(f'{family}{{{label}=~"{regex}"}}'), instants)
        assert every and [lab for lab, _ in some] == [lab for lab, _ in every]
        assert all(np.array_equal(a, b, equal_nan=True) for (_, a), (_, b) in zip(some, every))
