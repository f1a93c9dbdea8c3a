"""Settings of the subprocess workers of the metrics tests (tests/test_metrics.py): the guard
worker's settings plus the metrics jobs, with metrics on or off (DEDUP_JOBS_TEST_METRICS)."""

from __future__ import annotations

import os

from tests.settings_guard import *  # noqa: F403
from tests.settings_guard import DEDUP_JOBS

DEDUP_JOBS = {**DEDUP_JOBS, "METRICS": os.environ.get("DEDUP_JOBS_TEST_METRICS", "1") == "1"}
CELERY_IMPORTS = ("tests.jobs_guard", "tests.jobs_metrics")
