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
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine

from gpupool.canonical import SERIES_KEY
from gpupool.staging.schema import SERIES_PK, series_profile


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
    JSON text), replacing any row of that series and anchor in one statement, so that two runs
    storing the same series and anchor at once both succeed and the last one's row stays."""
    _key(key, computed_at)  # the key's shape, checked before anything is written
    rec = dict(zip(SERIES_KEY, key))
    rec.update(computed_at=computed_at, features=features, detector=detector, reason=reason, model=model)
    # an upsert, not delete-then-insert: two transactions that both delete nothing would both
    # insert, and the later one would fail on the primary key
    insert = {"postgresql": pg_insert, "sqlite": sqlite_insert}.get(engine.dialect.name)
    if insert is None:
        raise ValueError(f"the model store runs on PostgreSQL or SQLite, not {engine.dialect.name!r}")
    stmt = insert(series_profile).values(**rec)
    stmt = stmt.on_conflict_do_update(
        index_elements=[*SERIES_PK, "computed_at"],
        set_={c: stmt.excluded[c] for c in ("features", "detector", "reason", "model")},
    )
    with engine.begin() as conn:
        conn.execute(stmt)
