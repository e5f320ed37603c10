"""The one module that owns the staging database: engines, URLs, migrations, partitions."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).with_name("migrations")


class StagingError(RuntimeError):
    """The staging database cannot be used (unreachable, not migrated, bad URL)."""


def staging_url(explicit: str | None = None) -> str:
    """Where staging lives: an explicit URL, else `GPUPOOL_STAGING_URL`, else the
    Airflow connection `gpupool_staging` (as `AIRFLOW_CONN_GPUPOOL_STAGING` or through
    Airflow's own lookup when running inside it), else a SQLite file in the Airflow home."""
    if explicit:
        return _normalise(explicit)
    if os.environ.get("GPUPOOL_STAGING_URL"):
        return _normalise(os.environ["GPUPOOL_STAGING_URL"])
    conn_uri = os.environ.get("AIRFLOW_CONN_GPUPOOL_STAGING")
    if conn_uri:
        return _normalise(conn_uri)
    home = Path(os.environ.get("AIRFLOW_HOME", Path.cwd() / ".airflow"))
    return f"sqlite:///{home / 'gpupool_staging.db'}"


def _normalise(url: str) -> str:
    # Airflow connection URIs say postgres:// or postgresql://; the staging code uses psycopg 3.
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str | None = None, schema: str | None = None) -> Engine:
    """An engine on staging. `schema` (PostgreSQL only) isolates e.g. a test run."""
    url = staging_url(url)
    kwargs: dict = {"future": True}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 30}
    elif schema:
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}"}
    try:
        engine = sa.create_engine(url, **kwargs)
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise StagingError(f"staging URL {_redact(url)}: {exc}") from exc
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _redact(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable URL>"


def describe(engine: Engine) -> str:
    return _redact(str(engine.url.render_as_string(hide_password=False)))


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Apply migrations up to `revision`; returns the revision the database is at."""
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        return current_revision(engine)
    except sa.exc.OperationalError as exc:
        raise StagingError(f"staging database {describe(engine)} unreachable: {exc.orig}") from exc


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest migration this package ships."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def require_migrated(engine: Engine) -> None:
    """Raise unless the staging schema is at this package's newest migration."""
    current = current_revision(engine)
    if current is None:
        raise StagingError(f"staging database {describe(engine)} has no schema: run `gpupool db upgrade`")
    head = head_revision()
    if current != head:
        raise StagingError(
            f"staging database {describe(engine)} is at schema revision {current}, this gpupool needs {head}: "
            "run `gpupool db upgrade`"
        )


# --- day partitions of `sample` on PostgreSQL -------------------------------------------

def partition_name(day: datetime) -> str:
    return f"sample_p{day:%Y%m%d}"


def ensure_partitions(conn: sa.Connection, start: datetime, end: datetime) -> list[str]:
    """Create the day partitions of `sample` covering [start, end); no-op on SQLite."""
    if conn.dialect.name != "postgresql":
        return []
    created = []
    day = _day(start)
    while day < end:
        nxt = day + timedelta(days=1)
        name = partition_name(day)
        conn.execute(
            sa.text(
                f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF sample '
                f"FOR VALUES FROM ('{day.isoformat()}') TO ('{nxt.isoformat()}')"
            )
        )
        created.append(name)
        day = nxt
    return created


def list_partitions(conn: sa.Connection) -> list[str]:
    if conn.dialect.name != "postgresql":
        return []
    rows = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace "
            "WHERE p.relname = 'sample' AND n.nspname = current_schema() ORDER BY c.relname"
        )
    )
    return [r[0] for r in rows]


def drop_partitions_before(conn: sa.Connection, cutoff: datetime) -> list[str]:
    """Drop whole day partitions that end at or before `cutoff` (retention)."""
    dropped = []
    for name in list_partitions(conn):
        day = datetime.strptime(name[len("sample_p") :], "%Y%m%d").replace(tzinfo=timezone.utc)
        if day + timedelta(days=1) <= cutoff:
            conn.execute(sa.text(f'DROP TABLE "{name}"'))
            dropped.append(name)
    return dropped


def _day(ts: datetime) -> datetime:
    ts = ts.astimezone(timezone.utc) if ts.tzinfo else ts.replace(tzinfo=timezone.utc)
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)
