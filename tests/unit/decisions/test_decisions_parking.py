"""The parking rule: which idle nodes park, which parked nodes wake (pure)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from gpupool.decisions.parking import (
    ON, PARKED, WAKING, ParkingRule, PlatformPressure, PowerNode, decide_parking, wanted_gpus)

AT = datetime(2024, 1, 1, 12, tzinfo=timezone.utc)
LONG_AGO = AT - timedelta(hours=5)


def node(name, platform="a", busy=0.0, state=ON, idle_since=LONG_AGO, changed_at=None, transit=False):
    return PowerNode(name, platform, 8, busy, state, transit, idle_since, changed_at)


def decide(nodes, pressures, min_nodes=None, **rule):
    return decide_parking(nodes, pressures, ParkingRule(**rule), AT, wake_minutes=10, tick_minutes=5,
                          min_nodes=min_nodes)


def test_idle_nodes_beyond_the_pool_buffer_park_and_busy_ones_never():
    nodes = [node("a1", busy=8), node("a2", busy=8)] + [node(f"a{k}") for k in range(3, 9)]
    out = decide(nodes, {"a": PlatformPressure(demand=16)}, buffer=2, trend=False, forecast=False)
    assert out.need == {"a": 2}
    assert len(out.parks) == 4 and not {"a1", "a2"} & set(out.parks)
    assert out.wakes == ()


def test_the_buffer_is_one_for_the_pool_not_one_per_platform():
    nodes = [node(f"{p}{k}", p) for p in "abc" for k in range(1, 4)]
    quiet = {p: PlatformPressure(demand=0) for p in "abc"}
    assert len(decide(nodes, quiet, buffer=2, trend=False, forecast=False).parks) == 7
    per = decide(nodes, quiet, buffer=2, scope="platform")
    assert len(per.parks) == 3  # the Slurm-style rule keeps two idle nodes on each platform


def test_never_parks_below_min_nodes_in_transit_recently_changed_or_not_idle_long_enough():
    nodes = [node("a1"), node("a2", changed_at=AT - timedelta(minutes=20)), node("a3", transit=True),
             node("a4", idle_since=AT - timedelta(minutes=10)), node("a5"), node("a6")]
    out = decide(nodes, {"a": PlatformPressure(demand=0)}, min_nodes={"a": 4}, buffer=0, trend=False,
                 forecast=False)
    assert set(out.parks) <= {"a1", "a5", "a6"}
    assert len(out.parks) == 2  # six powered, four kept for min_nodes


def test_a_shortage_wakes_its_own_parked_nodes_at_once_and_no_more_than_needed_plus_the_buffer():
    nodes = [node("a1", busy=8)] + [node(f"a{k}", state=PARKED) for k in range(2, 10)]
    out = decide(nodes, {"a": PlatformPressure(demand=8 + 20)}, buffer=1, trend=False, forecast=False)
    # 28 GPUs: 4 nodes, 1 powered: 3 for the shortage, 1 for the buffer
    assert len(out.wakes) == 4
    assert out.parks == ()
    out = decide(nodes, {"a": PlatformPressure(demand=8 + 20)}, buffer=1, scope="platform")
    assert len(out.wakes) == 3  # the Slurm-style rule wakes on the shortage only


def test_wakes_ahead_of_a_rise_and_of_the_forecast():
    nodes = [node("a1", busy=8), node("a2", busy=8)] + [node(f"a{k}", state=PARKED) for k in range(3, 9)]
    flat = PlatformPressure(demand=16, recent=(16, 16, 16))
    rising = PlatformPressure(demand=16, recent=(0, 8, 16))
    assert decide(nodes, {"a": flat}, buffer=0).wakes == ()
    # 1.6 GPU a minute carried over the wake and a tick: 24 more GPUs, three nodes
    assert wanted_gpus(rising, ParkingRule(), 10, 5) == pytest.approx(16 + 1.6 * 15)
    assert len(decide(nodes, {"a": rising}, buffer=0).wakes) == 3
    assert decide(nodes, {"a": rising}, buffer=0, trend=False).wakes == ()
    ahead = PlatformPressure(demand=16, recent=(16, 16, 16), forecast_upper=30)
    assert len(decide(nodes, {"a": ahead}, buffer=0, forecast=True).wakes) == 2
    assert decide(nodes, {"a": ahead}, buffer=0, forecast=False).wakes == ()
    daily = PlatformPressure(demand=16, daily=40)
    assert decide(nodes, {"a": daily}, buffer=0).wakes == ()  # the daily rhythm is off by default
    assert len(decide(nodes, {"a": daily}, buffer=0, daily=True).wakes) == 3


def test_the_buffer_is_restored_where_headroom_is_least_and_waking_nodes_count_as_powered():
    nodes = [node("a1", busy=8), node("a2", state=PARKED), node("b1", busy=8), node("b2", state=WAKING),
             node("b3", state=PARKED)]
    nodes = [n if n.name.startswith("a") else PowerNode(n.name, "b", 8, n.busy_gpus, n.state) for n in nodes]
    out = decide(nodes, {"a": PlatformPressure(demand=8), "b": PlatformPressure(demand=8)}, buffer=2,
                 trend=False, forecast=False)
    assert out.wakes == ("a2",)  # b's waking node is one of the buffer already


def test_a_platform_without_a_reading_takes_no_part():
    nodes = [node("a1"), node("a2"), node("b1", "b", state=PARKED)]
    out = decide(nodes, {"b": PlatformPressure(demand=8)}, buffer=0, trend=False, forecast=False)
    assert out.parks == () and out.wakes == ("b1",)


def test_the_rule_refuses_unknown_knobs_and_bad_values():
    with pytest.raises(ValidationError):
        ParkingRule(bufer=3)
    with pytest.raises(ValidationError):
        ParkingRule(buffer=-1)
    with pytest.raises(ValidationError):
        ParkingRule(scope="cluster")


def test_a_platform_prone_to_jumps_keeps_room_for_its_usual_jump():
    nodes = [node("a1", busy=8)] + [node(f"a{k}", state=PARKED) for k in range(2, 6)]
    jumpy = PlatformPressure(demand=8, rises=(0.0,) * 80 + (16.0,) * 20)
    assert decide(nodes, {"a": jumpy}, buffer=0, rise_quantile=0).wakes == ()
    # the 90th percentile of its rises is 16 GPUs: two more nodes
    assert len(decide(nodes, {"a": jumpy}, buffer=0, forecast=False, rise_quantile=0.9).wakes) == 2
    assert decide(nodes, {"a": jumpy}, buffer=0, forecast=False, rise_quantile=0.5).wakes == ()


def test_parks_begin_at_most_at_the_park_rate_the_longest_idle_first_and_wakes_are_not_held_back():
    idle = [node(f"a{k:03d}", idle_since=LONG_AGO + timedelta(minutes=k)) for k in range(40)]
    pressures = {"a": PlatformPressure(demand=0)}
    out = decide(idle, pressures, buffer=0, trend=False, rise_quantile=0, park_per_minute=2)
    assert out.parks == tuple(f"a{k:03d}" for k in range(10))  # 2 a minute over a 5-minute tick
    out = decide(idle, pressures, buffer=0, trend=False, rise_quantile=0, scope="platform", park_per_minute=2)
    assert len(out.parks) == 10
    assert len(decide(idle, pressures, buffer=0, trend=False, rise_quantile=0).parks) == 40  # 60 a minute: all
    parked = [node(f"b{k:03d}", "b", state=PARKED) for k in range(30)]
    out = decide(parked, {"b": PlatformPressure(demand=8 * 30)}, trend=False, rise_quantile=0, park_per_minute=1)
    assert len(out.wakes) == 30  # a shortage wakes what it needs at once
    with pytest.raises(ValidationError):
        ParkingRule(park_per_minute=0)
