"""Fixtures of the jobs' tests: the in-memory datacenter of the actuation tests on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actuation"))
