"""Settings of the subprocess workers of the flow-control tests (tests/test_flow.py): the test
settings on the store the test names (``DEDUP_JOBS_TEST_FLOW_STORE``: "redis" or
"database-postgres" or "database-mariadb", then on the test's database of that server,
``DEDUP_JOBS_TEST_FLOW_DB_NAME``)."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DEDUP_JOBS

_STORE = os.environ.get("DEDUP_JOBS_TEST_FLOW_STORE", "")
if _STORE in ("database-postgres", "database-mariadb"):
    _ALIAS = _STORE.removeprefix("database-")
    DEDUP_JOBS = {**DEDUP_JOBS, "STORE": "database", "DATABASE_ALIAS": _ALIAS}
    DATABASES[_ALIAS]["NAME"] = os.environ["DEDUP_JOBS_TEST_FLOW_DB_NAME"]
if "DEDUP_JOBS_TEST_LEASE" in os.environ:  # L2: a short lease, so a cancel is read soon
    DEDUP_JOBS = {**DEDUP_JOBS, "LEASE_SECONDS": float(os.environ["DEDUP_JOBS_TEST_LEASE"])}
