"""The forecast stage's output: one `forecast_run` row and its `forecast` rows per issue.

This module knows its two tables and no stage. An issue (platform, series, issued_at) is
replaced whole in one transaction, so a rerun yields identical rows and a failure keeps the
previous ones.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
from sqlalchemy.engine import Engine

from gpupool.staging import loader
from gpupool.staging.schema import forecast, forecast_run

#: the columns of a forecast's rows (`replace_forecast`'s `rows`)
FORECAST_COLUMNS = [c.name for c in forecast.columns]


def replace_forecast(engine: Engine, platform: str, series: str, issued_at: datetime, *, model: str,
                     summary: dict, level: float, rows: pd.DataFrame) -> int:
    """Store the forecast of `series` of `platform` issued at `issued_at`: its run (`model`,
    the JSON-able `summary`, the interval `level`) and its `rows` (the `forecast` columns),
    replacing any earlier one of that issue, in one transaction. Returns the rows written."""
    missing = [c for c in FORECAST_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"forecast of {platform}/{series} issued at {issued_at}: rows lack columns {missing}")
    records = loader.records(rows[FORECAST_COLUMNS])
    with engine.begin() as conn:
        conn.execute(forecast_run.delete().where(
            forecast_run.c.platform == platform, forecast_run.c.series == series, forecast_run.c.issued_at == issued_at))
        conn.execute(forecast.delete().where(
            forecast.c.platform == platform, forecast.c.series == series, forecast.c.issued_at == issued_at))
        conn.execute(forecast_run.insert().values(
            platform=platform, series=series, issued_at=issued_at, model=model, summary=summary, level=level))
        conn.execute(forecast.insert(), records)
    return len(records)
