"""Fixtures of the handover tests; puts the in-memory datacenter beside them on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memplatform import make  # noqa: E402


@pytest.fixture
def datacenter():
    """``(Datacenter, {platform: MemActuator})`` with n1 on slurm, n2 on kubernetes, n3 on openstack."""
    return make()
