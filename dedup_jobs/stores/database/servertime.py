"""The database server's clock, in SQL (S3).

Every expiry the database store writes or compares is the server's "now" inside the statement
that decides, so hosts whose clocks disagree still agree on what expired:

- PostgreSQL: ``statement_timestamp()``, a ``timestamptz`` (absolute, whatever the zones).
- MySQL / MariaDB: ``UTC_TIMESTAMP(6)``, the statement's start (one value within a statement).
- SQLite has no server: ``strftime(…, 'now')`` is the clock of the host the process runs on
  (the system clock, not ``dedup_jobs.clock.now()``, the seam tests shift).

Backends without time zones (MySQL, SQLite) hold naive datetimes in the connection's zone
(UTC with ``USE_TZ``, else ``TIME_ZONE``): the server's UTC time is shifted by that zone's
current offset. Any other vendor gets the client's clock as a parameter, as before.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Expression

from dedup_jobs import clock

SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'{modifiers})"


def _offset(connection: BaseDatabaseWrapper) -> int:
    """Seconds the connection's zone is ahead of UTC now (0 for UTC, the usual case)."""
    name = connection.timezone_name
    if name == "UTC":
        return 0
    offset = dt.datetime.now(dt.timezone.utc).astimezone(zoneinfo.ZoneInfo(name)).utcoffset()
    return int(offset.total_seconds()) if offset else 0


def server_later(connection: BaseDatabaseWrapper, seconds: float = 0.0) -> tuple[str, list[Any]]:
    """SQL for the server's now + ``seconds``, in the column's representation, and its
    parameters (text and parameters go into the statement as they are)."""
    vendor = connection.vendor
    if vendor == "postgresql":
        if not seconds:
            return "statement_timestamp()", []
        return "(statement_timestamp() + make_interval(secs => %s))", [float(seconds)]
    if vendor == "mysql":
        offset = _offset(connection)
        now = f"(UTC_TIMESTAMP(6) + INTERVAL {offset} SECOND)" if offset else "UTC_TIMESTAMP(6)"
        if not seconds:
            return now, []
        return f"({now} + INTERVAL %s MICROSECOND)", [round(seconds * 1_000_000)]
    if vendor == "sqlite":
        offset = _offset(connection)
        zone = f", '{offset:+d} seconds'" if offset else ""
        if not seconds:
            return SQLITE_NOW.format(modifiers=zone), []
        return SQLITE_NOW.format(modifiers=f", %s{zone}"), [f"{seconds:+.3f} seconds"]
    value = clock.db_datetime(clock.now() + seconds)
    return "%s", [connection.ops.adapt_datetimefield_value(value)]


def server_now(connection: BaseDatabaseWrapper) -> tuple[str, list[Any]]:
    return server_later(connection)


def server_epoch(connection: BaseDatabaseWrapper) -> float:
    """The server's now in epoch seconds (one ``SELECT``: only to learn a clock skew)."""
    now, params = server_now(connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now}", params)
        (value,) = cursor.fetchone()
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=zoneinfo.ZoneInfo(connection.timezone_name))
    return float(value.timestamp())


class ServerNow(Expression):
    """The database server's now (+ ``seconds``) in a QuerySet: ``filter(expires_at__gt=
    ServerNow())``, ``update(expires_at=ServerNow(30))``, or as an annotation."""

    output_field = DateTimeField()

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__()
        self.seconds = seconds

    def __repr__(self) -> str:
        return f"ServerNow({self.seconds!r})"

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> tuple[str, tuple[Any, ...]]:
        text, params = server_later(connection, self.seconds)
        return text, tuple(params)
