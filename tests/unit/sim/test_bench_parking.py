"""The parking benches' shared rules and figures (bench/_parking.py), on cases worked out by hand."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from _parking import GPUPOOL, OFF, energy_table, figures, rules, slurm_name  # noqa: E402

from gpupool.sim.power import ParkingSpec  # noqa: E402


def test_the_rules_compared_share_the_wake_time():
    named = rules(7.0, {}, (2, 4))
    assert list(named) == [OFF, GPUPOOL, slurm_name(2), slurm_name(4)]
    assert named[OFF] is None
    gp, b4 = ParkingSpec(**named[GPUPOOL]), ParkingSpec(**named[slurm_name(4)])
    assert gp.model_dump() == ParkingSpec(wake_minutes=7.0).model_dump()  # the product defaults
    assert (b4.scope, b4.buffer, b4.idle_minutes, b4.cooldown_minutes, b4.wake_minutes) == ("platform", 4, 30, 0, 7.0)
    assert GPUPOOL not in rules(10.0, None, (2,))


def test_saved_charges_the_parked_draw_against_idle_energy_off():
    off = {"idle_kwh": 100.0, "parked_kwh": 0.0, "unmet_gpu_hours": 10.0, "wakes": 0, "late_wakes": 0}
    on = {"idle_kwh": 30.0, "parked_kwh": 5.0, "unmet_gpu_hours": 14.5, "wakes": 9, "late_wakes": 2}
    saved, added, wakes, late = figures(off, on)
    assert saved == pytest.approx(0.65) and added == pytest.approx(4.5) and (wakes, late) == (9, 2)
    assert figures({**off, "idle_kwh": 0.0}, on)[0] == 0.0  # nothing idle: nothing to save


def test_the_energy_table_names_its_rows_as_asked(capsys):
    off = {"idle_kwh": 100.0, "parked_kwh": 0.0, "unmet_gpu_hours": 10.0, "wakes": 0, "late_wakes": 0}
    on = {"idle_kwh": 30.0, "parked_kwh": 5.0, "unmet_gpu_hours": 14.5, "wakes": 9, "late_wakes": 2}
    totals = {("G3", 100, OFF): off, ("G3", 100, GPUPOOL): on}
    energy_table(totals, [("G3", 100)], [GPUPOOL])
    assert "| grouping | pool |" in capsys.readouterr().out.splitlines()[0]
    totals = {("demo-world", 14.0, OFF): off, ("demo-world", 14.0, GPUPOOL): on}
    energy_table(totals, [("demo-world", 14.0)], [GPUPOOL], heads=("scenario", "days"), unit="")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| scenario | days |")
    assert lines[2] == "| demo-world | 14 | 100 | 10 | 65% / +4 / 9 (2) |"


def test_the_bound_counts_a_jump_only_above_the_level_read_a_wake_before_plus_the_room():
    """bench/parking_bound.py's jump steps: a step counts when its demand passes the level read
    ``lag`` steps before plus ``room`` nodes of 8 GPUs; a climb slower than the room per lag does not."""
    import numpy as np
    from parking_bound import jump_steps

    served = np.array([8, 8, 8, 8, 40, 40, 40, 48, 56, 56], dtype=float)
    got = jump_steps(served, lag=2, room=1)
    # 40 GPUs against a level of 1 node read 2 steps before, plus 1: 16 GPUs -> a jump at 4 and 5;
    # step 6 reads 5 nodes: 40 and 48 are within (5 + 1) * 8; step 8's 56 passes (5 + 1) * 8 read at 6;
    # step 9's 56 is within (6 + 1) * 8 read at 7
    assert got.tolist() == [False, False, False, False, True, True, False, False, True, False]
    assert not jump_steps(served, lag=0, room=0).any()


def test_the_ownership_bound_serves_a_shortage_only_from_the_other_platforms_supply():
    """bench/ownership_bound.py's transport: a platform's own surplus never serves its own shortage."""
    from ownership_bound import _served, least_reserve

    assert _served([8, 0, 0], [8, 0, 0]) == 0  # only the short platform has supply
    assert _served([8, 0, 0], [0, 8, 0]) == 8
    assert _served([8, 8, 0], [8, 8, 0]) == 16  # they serve each other
    assert _served([16, 0, 0], [8, 4, 0]) == 4
    # the reserve goes first to the hour where it removes the most regret per node-hour
    import numpy as np

    cells = np.zeros((3, 24))
    cells[0, 5], cells[1, 5] = 10.0, 2.0
    cells[0, 9], cells[1, 9] = 3.0, 0.0
    reserve = least_reserve(cells, np.full(24, 12), bar=5.0)
    assert reserve[5] == 1 and reserve[9] == 0
    assert least_reserve(cells, np.full(24, 12), bar=0.0)[[5, 9]].tolist() == [2, 1]


def test_the_learnt_reserve_keeps_each_day_only_what_the_days_before_showed():
    """bench/ownership_bound.py --learn: a burst at the same hour every day is kept for from the
    second day on; a burst at an hour never seen before finds no reserve."""
    import numpy as np

    from ownership_bound import NODE_GPUS, learned_reserve

    days, n = 4, 4
    hours = np.tile(np.repeat(np.arange(24), 12), days)
    d = np.full(len(hours), float(NODE_GPUS))
    d[hours == 7] = 3 * NODE_GPUS  # every day at 07:00 the platform needs 3 nodes
    base = np.ones(len(d), int)  # one node kept at home by its level
    extra = learned_reserve(d, hours, n, base, learn=1, bar=0.0, steps=len(d))
    assert extra[: 288].sum() == 0  # the first day learns only
    assert (extra[288:][hours[288:] == 7] == 2).all() and (extra[288:][hours[288:] != 7] == 0).all()
    d[3 * 288:][hours[3 * 288:] == 19] = 2 * NODE_GPUS  # the last day bursts at 19:00 too: unforeseen
    extra = learned_reserve(d, hours, n, base, learn=1, bar=0.0, steps=len(d))
    assert (extra[3 * 288:][hours[3 * 288:] == 19] == 0).all()
