"""The facades' state rules, without HTTP: draining, moves, MIG changes, clock, PromQL subset."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.emulator.promql import PromQLError, evaluate, parse
from gpupool.emulator.state import SimConflict, SimInvalid, SimNotFound, SimState


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sc") / "small.yaml"
    path.write_text(
        "step: 5min\nnode_gpus: 4\nmove_minutes: 10\nstart: 2024-01-01\nend: 2024-01-03\nseed: 3\n"
        "platforms:\n"
        "  slurm: {synthetic: {base: 14, total_gpus: 16, noise: 0.0, bursts_per_day: 0, "
        "anomalies: {point: 0, drop: 0, spike: 0, gap: 0, counter_reset: 0}}, nodes: 4, "
        "gpu_model: Tesla V100-SXM2-32GB}\n"
        "  kubernetes: {synthetic: {base: 6, total_gpus: 16}, nodes: 4, gpu_model: NVIDIA H100 80GB HBM3}\n")
    return path


@pytest.fixture
def state(scenario_file):
    from gpupool.emulator.serve import make_state

    return make_state(scenario_file, speed=0)


def test_make_state_puts_the_clock_inside_the_window(state):
    assert str(state.now) == "2024-01-02 00:00:00+00:00"
    assert [n["name"] for n in state.nodes("slurm")] == ["gpu-n001", "gpu-n002", "gpu-n003", "gpu-n004"]
    assert state.nodes("openstack") == []  # no such platform in the scenario: an empty cloud


def test_drained_node_keeps_its_jobs_until_they_end(state):
    node = next(n for n in state.nodes("slurm") if n["busy_gpus"] > 0)
    jobs = {w.job_id for w in state.running("slurm") if w.node == node["name"]}
    state.cordon("slurm", node["name"], "gpupool: test", via="slurm")
    after = state.node("slurm", node["name"])
    assert after["cordoned"] and after["busy_gpus"] == node["busy_gpus"]
    seen = [after["busy_gpus"]]
    for _ in range(13):
        state.advance("5min")
        left = {w.job_id for w in state.running("slurm") if w.node == node["name"]}
        assert left <= jobs  # no new job lands on a drained node
        seen.append(state.node("slurm", node["name"])["busy_gpus"])
    assert seen[-1] == 0 and seen == sorted(seen, reverse=True)


def test_move_needs_a_released_empty_node(state):
    busy = next(n for n in state.nodes("slurm") if n["busy_gpus"] > 0)["name"]
    with pytest.raises(SimConflict, match="release it"):
        state.move(busy, "kubernetes")
    state.cordon("slurm", busy, "gpupool: move", via="slurm")
    with pytest.raises(SimConflict, match="still runs"):
        state.move(busy, "kubernetes")
    for w in [w for w in state.running("slurm") if w.node == busy]:
        state.evict("slurm", w.job_id)
    with pytest.raises(SimInvalid):
        state.move(busy, "mainframe")
    arrive = state.move(busy, "kubernetes")
    assert busy not in [n["name"] for n in state.nodes("kubernetes")]  # in transit
    state.advance(arrive - state.now)
    node = state.node("kubernetes", busy)
    assert node["schedulable"] and not node["cordoned"]
    with pytest.raises(SimNotFound):
        state.node("slurm", busy)


def test_mig_change_needs_empty_node_and_time(state):
    busy = next(n for n in state.nodes("kubernetes") if n["busy_gpus"] > 0)["name"]
    assert state.request_mig("kubernetes", busy, "all-1g.10gb").state == "failed"
    empty = next(n for n in state.nodes("kubernetes") if n["busy_gpus"] == 0)["name"]
    change = state.request_mig("kubernetes", empty, "all-1g.10gb")
    assert change.state == "pending" and state.node("kubernetes", empty)["cordoned"]
    state.advance("10min")
    assert state.world.mig_layout_[empty] == "all-disabled"
    state.advance("5min")
    assert change.state == "success" and state.world.mig_layout_[empty] == "all-1g.10gb"
    assert not state.node("kubernetes", empty)["cordoned"]
    with pytest.raises(SimInvalid):
        state.request_mig("slurm", "gpu-n001", "all-1g.10gb")  # a V100 has no MIG


def test_clock_follows_wall_time_times_speed(scenario_file):
    from gpupool.emulator.serve import make_state

    wall = [0.0]
    st = make_state(scenario_file, speed=60.0, wallclock=lambda: wall[0])
    start = st.now
    wall[0] = 30.0  # 30 s of wall time at 60x = 30 simulated minutes
    assert (st.sync() - start).total_seconds() == 1800


def test_job_ids_are_stable_between_calls(state):
    a = {(w.node, w.slot): w.job_id for w in state.running("slurm")}
    state._cache.clear()
    b = {(w.node, w.slot): w.job_id for w in state.running("slurm")}
    assert a == b and len(set(a.values())) == len(a)


def test_promql_subset_evaluates_and_refuses():
    series = [({"__name__": "m", "node": "a", "gpu": "0"}, np.array([1.0, np.nan])),
              ({"__name__": "m", "node": "a", "gpu": "1"}, np.array([3.0, 2.0])),
              ({"__name__": "m", "node": "b", "gpu": "0"}, np.array([5.0, 4.0]))]

    def resolve(sel):
        return [(lab, v) for lab, v in series if all(m.matches(lab) for m in sel.matchers)]

    out = {lab["node"]: v for lab, v in evaluate(parse("sum by (node) (m)"), resolve, 2)}
    assert out["a"].tolist() == [4.0, 2.0] and out["b"].tolist() == [5.0, 4.0]
    scaled = evaluate(parse('max(m{node!="b"}) * 2'), resolve, 2)
    assert scaled[0][0] == {} and scaled[0][1].tolist() == [6.0, 4.0]
    assert len(evaluate(parse('m{gpu=~"0|1", node!~"b"}'), resolve, 2)) == 2
    for bad in ("rate(m[5m])", "m > 1", "m + m", '{node=""}', "m offset 5m"):
        with pytest.raises(PromQLError):
            evaluate(parse(bad), resolve, 2)


def test_a_bmc_powers_an_empty_node_off_and_it_serves_again_after_its_boot(state):
    from gpupool.emulator.kubernetes_objects import node_object

    nodes = state.nodes("kubernetes")
    idle = next(n for n in nodes if n["busy_gpus"] == 0)["name"]
    busy = next(n for n in nodes if n["busy_gpus"] > 0)["name"]
    with pytest.raises(SimConflict, match="would kill"):
        state.power(busy, on=False)  # work on it: parking waits for the node to empty
    with pytest.raises(SimNotFound):
        state.power("gpu-nope", on=False)
    state.power(idle, on=False)
    off = state.node("kubernetes", idle)
    assert off["powered"] is False and not off["schedulable"] and off["platform"] == "kubernetes"  # it stays its owner's
    ready = next(c for c in node_object(state, off)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown"
    assert state.power(idle, on=False) == state.now  # a repeated reset: nothing to do
    for _ in range(6):
        state.advance("5min")
        assert state.node("kubernetes", idle)["busy_gpus"] == 0  # nothing runs on a powered-off node
    with pytest.raises(SimInvalid):
        state.power(idle, on=True, minutes=-1)
    done = state.power(idle, on=True, minutes=10)
    assert done == state.now + np.timedelta64(10, "m")
    state.advance("5min")
    assert state.node("kubernetes", idle)["powered"] is False  # still booting
    assert state.power(idle, on=True, minutes=10) == done  # a repeated reset does not boot it again
    state.advance("5min")
    back = state.node("kubernetes", idle)
    assert back["powered"] is True and back["schedulable"]
    ready = next(c for c in node_object(state, back)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


def test_the_control_api_takes_a_power_reset_and_names_what_is_wrong(state):
    from starlette.testclient import TestClient

    from gpupool.emulator.control import make_app

    client = TestClient(make_app(state))
    idle = next(n for n in state.nodes("kubernetes") if n["busy_gpus"] == 0)["name"]
    busy = next(n for n in state.nodes("kubernetes") if n["busy_gpus"] > 0)["name"]
    assert client.post(f"/sim/v1/nodes/{idle}/power", content=b'{"on": "no"}').status_code == 400
    assert client.post(f"/sim/v1/nodes/{idle}/power", content=b"[]").status_code == 400
    assert client.post("/sim/v1/nodes/gpu-nope/power", json={"on": False}).status_code == 404
    assert client.post(f"/sim/v1/nodes/{busy}/power", json={"on": False}).status_code == 409
    r = client.post(f"/sim/v1/nodes/{idle}/power", json={"on": False})
    assert r.status_code == 202 and r.json()["on"] is False
    assert next(n for n in client.get("/sim/v1/pool").json()["nodes"] if n["name"] == idle)["powered"] is False
    r = client.post(f"/sim/v1/nodes/{idle}/power", json={"on": True, "minutes": 0})
    assert r.status_code == 202
    assert next(n for n in client.get("/sim/v1/pool").json()["nodes"] if n["name"] == idle)["powered"] is True
