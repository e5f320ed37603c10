"""The MIG table is defined once (gpupool.mig) and used by sources, planner, actuators and the
simulator alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpupool
from gpupool import mig

PACKAGE = Path(gpupool.__file__).resolve().parent
#: literals that belong to the MIG table: no other module may spell them out again
TABLE_LITERALS = {mig.CONFIG_LABEL, mig.STATE_LABEL, mig.RESOURCE_PREFIX, mig.DISABLED, *mig.SLICES_PER_GPU}


@pytest.mark.parametrize("model, capable", [
    ("NVIDIA A100-SXM4-80GB", True), ("NVIDIA H100 80GB HBM3", True), ("NVIDIA H200", True),
    ("NVIDIA A30", True), ("NVIDIA B200", True), ("Tesla V100-SXM2-32GB", False), ("NVIDIA L40S", False),
    ("", False), (None, False)])
def test_mig_capable_models(model, capable):
    assert mig.is_mig_capable(model) is capable


def test_layouts_and_profiles_round_trip():
    for profile, n in mig.SLICES_PER_GPU.items():
        assert 1 <= n <= 7
        assert mig.layout_profile(mig.uniform_layout(profile)) == profile
    assert mig.uniform_layout(None) == mig.DISABLED
    assert all(mig.layout_profile(w) is None for w in mig.WHOLE_LAYOUTS)
    assert mig.profile_in("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert mig.profile_in("NVIDIA H100 80GB HBM3") is None


def test_every_user_reads_the_one_table():
    from gpupool.decisions import planner
    from gpupool.actuation.actuators import kubernetes as k8s_actuator
    from gpupool.sim import world
    from gpupool.emulator import state

    assert planner.SLICES_PER_GPU is mig.SLICES_PER_GPU and planner.WHOLE_LAYOUTS is mig.WHOLE_LAYOUTS
    assert world.MIG_MODELS is mig.MIG_MODELS and world.mig_capable is mig.is_mig_capable
    assert k8s_actuator.MIG_CONFIG_LABEL is mig.CONFIG_LABEL and state.MIG_LABEL is mig.CONFIG_LABEL


def test_no_module_copies_the_table():
    copies = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "mig.py" or "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        found = sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in TABLE_LITERALS})
        models = [n for n in ast.walk(tree) if isinstance(n, (ast.Tuple, ast.List, ast.Set))
                  and sum(isinstance(e, ast.Constant) and e.value in mig.MIG_MODELS for e in n.elts) >= 2]
        if found or models:
            copies[str(path.relative_to(PACKAGE))] = found + ["<model list>"] * len(models)
    assert copies == {}
