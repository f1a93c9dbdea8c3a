"""tests.settings plus the CACHES alias "cluster" (made DEDUP_JOBS["STORE"]) of a prefork
worker in a subprocess: its entry comes as JSON in DEDUP_JOBS_TEST_CLUSTER_CACHE."""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import CACHES, DEDUP_JOBS

CELERY_IMPORTS = ("tests.jobs_debounce",)

_entry = os.environ.get("DEDUP_JOBS_TEST_CLUSTER_CACHE")
if _entry:
    CACHES = {**CACHES, "cluster": json.loads(_entry)}
    DEDUP_JOBS = {**DEDUP_JOBS, "STORE": "cluster"}
