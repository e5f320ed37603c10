"""The one module that owns the staging database: engines, URLs, migrations, partitions."""

from __future__ import annotations

import os
import weakref
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from gpupool.errors import UserError

MIGRATIONS = Path(__file__).with_name("migrations")


class StagingError(UserError, RuntimeError):
    """The staging database cannot be used (unreachable, not migrated, bad URL)."""


class StagingUnavailable(StagingError):
    """The staging database did not answer: refused, timed out, or went away mid-statement.

    The message names where staging was configured (`GPUPOOL_STAGING_URL` or the connection
    `gpupool_staging`), never any part of the URL."""


#: seconds; PostgreSQL only. A server that accepts and never answers fails after these.
CONNECT_TIMEOUT_ENV = "GPUPOOL_STAGING_CONNECT_TIMEOUT"
STATEMENT_TIMEOUT_ENV = "GPUPOOL_STAGING_STATEMENT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT = 10
DEFAULT_STATEMENT_TIMEOUT = 300

_LABELS: "weakref.WeakKeyDictionary[Engine, str]" = weakref.WeakKeyDictionary()


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


def staging_label(explicit: str | None = None) -> str:
    """Where staging was configured, for messages: a name, never the URL."""
    if explicit:
        return "the staging URL given"
    if os.environ.get("GPUPOOL_STAGING_URL"):
        return "GPUPOOL_STAGING_URL"
    if os.environ.get("AIRFLOW_CONN_GPUPOOL_STAGING"):
        return "connection gpupool_staging"
    return "the local SQLite staging file"


def label(engine: Engine) -> str:
    return _LABELS.get(engine, "staging")


#: the longest timeout PostgreSQL accepts, in whole seconds (its settings are int milliseconds)
MAX_TIMEOUT = (2**31 - 1) // 1000


def timeouts(env=None) -> tuple[int, int]:
    """(connect, statement) timeouts in seconds from the environment, else the defaults."""
    env = os.environ if env is None else env
    out = []
    for name, default in ((CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT), (STATEMENT_TIMEOUT_ENV, DEFAULT_STATEMENT_TIMEOUT)):
        raw = env.get(name, "").strip()
        try:
            value = int(raw) if raw else default
        except ValueError:
            value = -1
        if value < 1:
            raise StagingError(f"{name} must be a whole number of seconds >= 1, got {raw!r}")
        if value > MAX_TIMEOUT:  # PostgreSQL takes timeouts in milliseconds, at most 2^31 - 1
            raise StagingError(f"{name} must be at most {MAX_TIMEOUT} seconds (PostgreSQL's maximum), got {raw!r}")
        out.append(value)
    return out[0], out[1]


def _normalise(url: str) -> str:
    # Airflow connection URIs say postgres:// or postgresql://; the staging code uses psycopg 3.
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str | None = None, schema: str | None = None) -> Engine:
    """An engine on staging. `schema` (PostgreSQL only) isolates e.g. a test run.

    PostgreSQL engines connect within `GPUPOOL_STAGING_CONNECT_TIMEOUT` seconds (default 10)
    and cancel any statement running longer than `GPUPOOL_STAGING_STATEMENT_TIMEOUT` (default
    300); a database that does not answer raises :class:`StagingUnavailable`."""
    where = staging_label(url)
    url = staging_url(url)
    kwargs: dict = {"future": True}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 30}
    elif url.startswith("postgresql"):
        connect_s, statement_s = timeouts()
        options = f"-c statement_timeout={statement_s * 1000}"
        if schema:
            options = f"-c search_path={schema} " + options
        kwargs["connect_args"] = {"connect_timeout": connect_s, "options": options}
    elif schema:
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}"}
    try:
        engine = sa.create_engine(url, **kwargs)
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise StagingError(f"staging URL from {where} is not usable: {type(exc).__name__}") from exc
    except (ValueError, TypeError) as exc:  # e.g. a port that is not a number
        raise StagingError(f"staging URL from {where} is not usable: it does not parse as a URL "
                           f"({type(exc).__name__}; is the port a number?)") from exc
    if engine.dialect.is_async:  # every stage talks to staging synchronously
        engine.dispose()
        raise StagingError(f"staging URL from {where} names an asyncio driver; give a synchronous one "
                           "(postgresql+psycopg://, or postgresql:// which means it)")
    _LABELS[engine] = where
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    else:
        sa.event.listen(engine, "handle_error", _unavailable)
    return engine


def _unavailable(context) -> None:
    """Turn "the database does not answer" into one StagingUnavailable naming where staging
    was configured; other errors (constraint violations, bad SQL) pass unchanged."""
    exc = context.original_exception
    engine = context.engine
    where = label(engine) if engine is not None else "staging"
    text = str(exc).lower()
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate == "57014" and "statement timeout" in text:
        _, statement_s = timeouts()
        raise StagingUnavailable(
            f"staging database ({where}) did not finish a statement within {statement_s} s "
            f"(set {STATEMENT_TIMEOUT_ENV} to allow longer)") from exc
    connecting = context.connection is None or getattr(context, "is_pre_ping", False)
    if not (connecting or context.is_disconnect):
        return
    if "timeout" in text or "timed out" in text:
        connect_s, _ = timeouts()
        why = f"no answer within {connect_s} s (set {CONNECT_TIMEOUT_ENV} to wait longer)"
    elif "refused" in text:
        why = "connection refused"
    elif "authentication" in text or "password" in text:
        why = "authentication failed"
    elif "does not exist" in text:
        why = "the database or role does not exist"
    elif context.is_disconnect and not connecting:
        why = "the connection was lost"
    else:
        why = f"cannot connect ({type(exc).__name__})"
    raise StagingUnavailable(f"staging database ({where}) unreachable: {why}") from exc


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
    """Apply migrations up to `revision`; returns the revision the database is at.

    Refuses, with one line, a database at a revision this package does not ship, one that
    holds tables of gpupool's names but no gpupool revision (another tool's), and a role
    that may not create gpupool's tables."""
    from alembic.util.exc import CommandError

    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            _refuse_foreign_tables(conn, engine)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        return current_revision(engine)
    except CommandError as exc:
        raise StagingError(
            f"staging database ({label(engine)}) cannot be upgraded to {revision!r}: {exc}; it was migrated by "
            f"another gpupool version (this one ships up to {head_revision()}) or by another tool"
        ) from exc
    except sa.exc.ProgrammingError as exc:
        if not _insufficient_privilege(exc):
            raise
        raise StagingError(f"staging database ({label(engine)}): the role may not create gpupool's tables "
                           "(InsufficientPrivilege); run `gpupool db upgrade` as the schema's owner") from exc
    except sa.exc.OperationalError as exc:  # SQLite, or an error the handler let through
        raise StagingUnavailable(f"staging database ({label(engine)}) unusable: {type(exc.orig).__name__}") from exc


def _refuse_foreign_tables(conn: sa.Connection, engine: Engine) -> None:
    """Tables named like gpupool's in a database with no gpupool revision are another tool's:
    migrating over them would fail half-way or, worse, write into them."""
    if MigrationContext.configure(conn).get_current_revision() is not None:
        return
    from gpupool.staging.schema import metadata

    theirs = sorted(set(sa.inspect(conn).get_table_names()) & set(metadata.tables))
    if theirs:
        raise StagingError(
            f"staging database ({label(engine)}) has no gpupool schema revision but holds tables named like "
            f"gpupool's ({', '.join(theirs)}): they belong to another tool; give gpupool a database or schema "
            "of its own"
        )


def _insufficient_privilege(exc: BaseException) -> bool:
    """Whether a database error is PostgreSQL's InsufficientPrivilege (SQLSTATE 42501)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "42501"


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
        raise StagingError(f"staging database ({label(engine)}) has no schema: run `gpupool db upgrade`")
    head = head_revision()
    if current != head:
        raise StagingError(
            f"staging database ({label(engine)}) is at schema revision {current}, this gpupool needs {head}: "
            "run `gpupool db upgrade`"
        )


# --- day partitions of `sample` on PostgreSQL -------------------------------------------

def partition_name(day: datetime) -> str:
    return f"sample_p{day:%Y%m%d}"


#: the transaction lock of one partition's creation, keyed on its schema-qualified name
_PARTITION_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('gpupool-partition:' || current_schema() || '.' || :n, 0))"
)


def ensure_partitions(conn: sa.Connection, start: datetime, end: datetime) -> list[str]:
    """Create the day partitions of `sample` covering [start, end); no-op on SQLite."""
    if conn.dialect.name != "postgresql":
        return []
    created = []
    day = _day(start)
    while day < end:
        nxt = day + timedelta(days=1)
        name = partition_name(day)
        # IF NOT EXISTS alone races: two writers that both miss the partition both create it,
        # and the later one fails with DuplicateTable. The transaction lock on the schema-
        # qualified name makes the later one wait for the first's commit and then find it.
        if conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": f'"{name}"'}).scalar() is None:
            conn.execute(sa.text(_PARTITION_LOCK), {"n": name})
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
