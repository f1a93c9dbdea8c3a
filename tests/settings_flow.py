"""Settings of the subprocess workers of the flow-control tests (tests/test_flow.py): the test
settings on the store the test names (``DEDUP_JOBS_TEST_FLOW_STORE``: "redis" or
"database-postgres", then on the test's PostgreSQL database ``DEDUP_JOBS_TEST_PG_NAME``)."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DEDUP_JOBS

if os.environ.get("DEDUP_JOBS_TEST_FLOW_STORE") == "database-postgres":
    DEDUP_JOBS = {**DEDUP_JOBS, "STORE": "database", "DATABASE_ALIAS": "postgres"}
    DATABASES["postgres"]["NAME"] = os.environ["DEDUP_JOBS_TEST_PG_NAME"]
