"""Settings of the subprocess workers of the throttling tests (tests/test_throttle_worker.py):
the flow tests' settings (the store named by ``DEDUP_JOBS_TEST_FLOW_STORE``) with the lease
the test names (``DEDUP_JOBS_TEST_LEASE`` seconds, default 60)."""

from __future__ import annotations

import os

from tests.settings_flow import *  # noqa: F403
from tests.settings_flow import DEDUP_JOBS

DEDUP_JOBS = {**DEDUP_JOBS, "LEASE_SECONDS": float(os.environ.get("DEDUP_JOBS_TEST_LEASE", 60))}
