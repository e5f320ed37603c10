"""Fixtures of the contract tests: the facades on ephemeral loopback ports over a small world.

The world (three synthetic platforms, three days, the clock one day in, frozen) is built once
per session and copied for each test, so a test's drains and moves never leak into another.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


@pytest.fixture(scope="session")
def base_world():
    from gpupool.sim.world import World, default_world

    world = default_world("2024-01-01", "2024-01-04", seed=7)
    return World(world.scenario, clock="2024-01-02")


@pytest.fixture
def state(base_world):
    from gpupool.emulator.state import SimState

    return SimState(copy.deepcopy(base_world), speed=0)


@pytest.fixture
def sim(state):
    """Running facades (``sim.urls``, ``sim.state``) over a fresh copy of the world."""
    from gpupool.emulator.serve import serve_in_thread

    with serve_in_thread(state) as servers:
        yield servers


def recorded(name: str) -> dict:
    """A response recorded from the real service by tests/contract/record_real.py."""
    path = RECORDED / f"{name}.json"
    if not path.exists():
        pytest.fail(f"{path} missing: run `.venv/bin/python -m tests.contract.record_real`")
    return json.loads(path.read_text())
