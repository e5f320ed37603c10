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

#: what a forecast gives per step, in step order (`replace_forecast`'s `steps`)
STEP_COLUMNS = ["ts", "yhat", "yhat_lower", "yhat_upper"]


def replace_forecast(engine: Engine, platform: str, series: str, issued_at: datetime, *, model: str,
                     summary: dict, level: float, steps: pd.DataFrame) -> int:
    """Store the forecast of `series` of `platform` issued at `issued_at`: its run (`model`,
    the JSON-able `summary`, the interval `level`) and one row per step of `steps` (step 1
    first; columns `ts, yhat, yhat_lower, yhat_upper`), replacing any earlier one of that
    issue, in one transaction. Returns the rows written."""
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise ValueError(f"forecast of {platform}/{series} issued at {issued_at}: steps lack columns {missing}")
    rows = pd.DataFrame(
        {
            "platform": platform,
            "series": series,
            "issued_at": pd.Timestamp(issued_at),
            "step": range(1, len(steps) + 1),
            "ts": pd.to_datetime(steps["ts"], utc=True),
            "yhat": steps["yhat"].to_numpy(),
            "yhat_lower": steps["yhat_lower"].to_numpy(),
            "yhat_upper": steps["yhat_upper"].to_numpy(),
        }
    )
    records = loader.records(rows)
    with engine.begin() as conn:
        conn.execute(forecast_run.delete().where(
            forecast_run.c.platform == platform, forecast_run.c.series == series, forecast_run.c.issued_at == issued_at))
        conn.execute(forecast.delete().where(
            forecast.c.platform == platform, forecast.c.series == series, forecast.c.issued_at == issued_at))
        conn.execute(forecast_run.insert().values(
            platform=platform, series=series, issued_at=issued_at, model=model, summary=summary, level=level))
        conn.execute(forecast.insert(), records)
    return len(records)
