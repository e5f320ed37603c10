"""Synthetic series for the detect unit tests (no files, no network, no Airflow)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def seasonal_series(n: int = 2016, seed: int = 0, noise: float = 0.3, step: str = "5min") -> pd.Series:
    """A daily cycle at 5-minute steps with Gaussian noise."""
    rng = np.random.default_rng(seed)
    idx = pd.date_range("2025-01-06", periods=n, freq=step, tz="UTC")
    t = np.arange(n)
    return pd.Series(20 + 5 * np.sin(2 * np.pi * t / 288) + rng.normal(0, noise, n), index=idx, name="gpu_util")


@pytest.fixture
def seasonal() -> pd.Series:
    return seasonal_series()


@pytest.fixture
def spiky() -> tuple[pd.Series, list[int]]:
    """The seasonal series with three large spikes and one exporter zero after its first day."""
    y = seasonal_series(seed=1)
    where = [700, 1100, 1500, 1800]
    y.iloc[700] += 12
    y.iloc[1100] -= 12
    y.iloc[1500] += 15
    y.iloc[1800] = 0.0
    return y, where


@pytest.fixture(scope="session")
def make_seasonal():
    """Factory for seasonal series with chosen length, seed, noise and step."""
    return seasonal_series
