"""The detect stage's model store: one fitted model per series and refit anchor, in `series_profile`.

This module knows its table and no stage, and moves text: the model is stored as the JSON
text of its parameters and handed back as the stored text, never unpickled (a staging row is
data, not code). Rebuilding a model from that text, and deciding when to refit, is the
detect stage's (`gpupool.detect.stage.model_for`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.canonical import SERIES_KEY
from gpupool.staging.schema import series_profile


def _key(key: tuple, computed_at: datetime) -> list:
    if len(key) != len(SERIES_KEY):
        raise ValueError(f"a series key has {len(SERIES_KEY)} parts {SERIES_KEY}, got {key!r}")
    return [*(series_profile.c[c] == v for c, v in zip(SERIES_KEY, key)), series_profile.c.computed_at == computed_at]


def model_text(engine: Engine, key: tuple, computed_at: datetime) -> Any:
    """The stored model of series `key` fitted at `computed_at`, as stored (JSON text, or
    whatever a writer put there); None when there is no row or its model was dropped."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(series_profile.c.model).where(*_key(key, computed_at)).limit(1)).first()
    return None if row is None else row.model


def replace_model(engine: Engine, key: tuple, computed_at: datetime, *, features: dict, detector: str,
                  reason: str, model: str) -> None:
    """Store the model of series `key` fitted at `computed_at` (`model`: its parameters as
    JSON text), replacing any row of that series and anchor, in one transaction."""
    rec = dict(zip(SERIES_KEY, key))
    rec.update(computed_at=computed_at, features=features, detector=detector, reason=reason, model=model)
    cond = _key(key, computed_at)
    with engine.begin() as conn:
        conn.execute(series_profile.delete().where(*cond))
        conn.execute(series_profile.insert().values(**rec))
