"""The one time seam: every part of dedup_jobs asks ``clock.now()`` for the wall time.

Tests replace it (``monkeypatch.setattr("dedup_jobs.clock.now", ...)``) instead of sleeping.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone


def now() -> float:
    """Seconds since the epoch, as ``time.time()``."""
    return time.time()


def now_ms() -> int:
    return int(now() * 1000)


def to_datetime(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc)


def db_datetime(timestamp: float) -> datetime:
    """``timestamp`` as Django stores datetimes: aware (UTC) with USE_TZ, naive local without."""
    from django.conf import settings
    from django.utils import timezone as dj_timezone

    value = to_datetime(timestamp)
    return value if settings.USE_TZ else dj_timezone.make_naive(value)
