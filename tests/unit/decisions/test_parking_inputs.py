"""The pure inputs production and the what-if build the parking rule from, one way: a platform's
pressure from its readings, the plan's bound for the hour a wake serves, the day-ago window, and
what the fast path's decision makes of nodes that are powered down."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool.decisions.fastpath import Judged, PlanBounds, Settings, decide, with_power
from gpupool.decisions.parking import (
    TREND_TICKS, WAKE_MINUTES, ParkingRule, ParkingSettings, daily_window, kept_readings, plan_upper,
    pressure_from_readings)
from gpupool.sources.base import Pressure

AT = datetime(2026, 6, 3, 12, 0, tzinfo=timezone.utc)


def test_a_platforms_pressure_from_its_readings():
    rule = ParkingRule()
    p = pressure_from_readings([1.0, 2.0, 4.0, 8.0, 8.0], rule, wake_minutes=10, tick_minutes=5)
    assert (p.demand, p.recent) == (8.0, (4.0, 8.0, 8.0)) and len(p.recent) == TREND_TICKS
    # rises over the wake time and a tick (three ticks of 5 minutes) across the day
    assert p.rises == (7.0, 6.0)
    off = pressure_from_readings([1.0, 2.0, 4.0, 8.0, 8.0], rule.model_copy(update={"rise_quantile": 0}),
                                 wake_minutes=10, tick_minutes=5, forecast_upper=12.0, daily=3.0)
    assert (off.rises, off.forecast_upper, off.daily) == ((), 12.0, 3.0)
    # a day of readings and the one before: older ones are not read
    long = pressure_from_readings([100.0] + [0.0] * kept_readings(5), rule, wake_minutes=10, tick_minutes=5)
    assert max(long.rises) == 0.0 and kept_readings(5) == 289 and kept_readings(60) == 25
    with pytest.raises(ValueError):
        pressure_from_readings([], rule, wake_minutes=10, tick_minutes=5)


def test_the_plans_bound_for_the_hour_a_wake_serves_and_the_day_ago_window():
    assert plan_upper([10.0, 20.0], AT, AT + timedelta(minutes=45), 10) == 10.0
    assert plan_upper([10.0, 20.0], AT, AT + timedelta(minutes=55), 10) == 20.0
    assert plan_upper([10.0, 20.0], AT, AT + timedelta(hours=5), 10) == 20.0
    assert plan_upper([], AT, AT, 10) is None
    assert daily_window(AT, 10, 5) == (AT - timedelta(days=1), AT - timedelta(days=1) + timedelta(minutes=15))


def test_production_and_the_whatif_share_the_rules_defaults():
    from gpupool.config import parse_config
    from gpupool.sim.power import ParkingSpec

    cfg = parse_config({"platforms": [{"name": "a", "kind": "simulator"}]})
    prod, whatif = cfg.parking_settings(), ParkingSpec()
    assert isinstance(prod, ParkingSettings) and prod.wake_minutes == whatif.wake_minutes == WAKE_MINUTES
    assert {k: getattr(prod, k) for k in ParkingRule.model_fields} == {k: getattr(whatif, k) for k in ParkingRule.model_fields}


def _reading(platform, nodes, idle, pending=0.0, allocated=0.0):
    return Judged(Pressure(platform, AT, allocated, pending, 8.0 * len(nodes), tuple(idle), {n: 8 for n in nodes},
                           len(nodes), {}))


def test_powered_down_nodes_are_never_lent_parked_ones_count_and_waking_ones_are_on_their_way():
    judged = {"a": _reading("a", ["a1", "a2", "a3"], ["a2", "a3"], pending=16.0, allocated=8.0),
              "b": _reading("b", ["b1", "b2", "b3"], ["b1", "b2", "b3"])}
    # b2 is parked but its platform still lists it open (Slurm shows a powered-down node idle),
    # b3 is parking, a3 waking; b1 alone may be lent
    power = {"b2": ("parked", "b"), "b3": ("parking", "b"), "a3": ("waking", "a")}
    out, waking = with_power(judged, power, {n: 8 for n in ("a1", "a2", "a3", "b1", "b2", "b3")})
    b, a = out["b"].pressure, out["a"].pressure
    assert b.idle_nodes == ("b1",) and (b.gpus_capacity, b.nodes_open) == (16.0, 2)
    assert a.idle_nodes == ("a2",) and (a.gpus_capacity, a.nodes_open) == (16.0, 2)
    assert waking == [{"node": "a3", "to_platform": "a", "state": "waking", "gpus": 8}]
    moves = [d for d in decide(out, PlanBounds(None, None), [], waking, AT, Settings()) if hasattr(d, "node")]
    # a is short 16 - 8 free - 8 waking = 0: no move for what the wake answers
    assert moves == []
    # a parked node its platform does not list open is still its platform's capacity, not lent
    out2, _ = with_power({"b": _reading("b", ["b1"], ["b1"])}, {"b9": ("parked", "b")}, {"b9": 8})
    assert (out2["b"].pressure.gpus_capacity, out2["b"].pressure.nodes_open, out2["b"].pressure.idle_nodes) == (
        16.0, 2, ("b1",))
    # nothing powered down: the readings are taken as they are
    same, none = with_power(judged, {}, {})
    assert same == judged and none == []
