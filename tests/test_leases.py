"""U5: leases. A running job's lock is renewed while its worker lives, so a job that runs far
longer than its unique_for keeps it; when the worker is SIGKILLed the lock is gone within
LEASE_SECONDS with nobody acting. Proven with the prefork, threads and solo pools at once
(one subprocess worker each, on the real Redis broker), LEASE_SECONDS=5."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import pytest

from tests import jobs_guard as jg
from tests.guard_support import (
    BROKERS,
    QUEUE,
    kill_worker,
    publishing_to,
    report,
    reset_queue,
    token,
    worker_env,
)
from tests.workers import process_worker, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]

LEASE_SECONDS = 5.0
POOLS = {"prefork": 2, "threads": 2, "solo": 1}


def test_lease_renewed_while_running_and_gone_within_lease_after_sigkill(app: Any) -> None:
    """U5: a job with unique_for=1 that runs 6 s (longer than unique_for and than one lease)
    keeps its lock the whole time, renewed every LEASE_SECONDS/3; after SIGKILL of its worker
    the lock disappears by itself within LEASE_SECONDS (5 s). Prefork, threads and solo."""
    url = BROKERS["redis"]
    t = token()
    env = {"DEDUP_JOBS_TEST_LEASE_SECONDS": str(LEASE_SECONDS)}
    with ExitStack() as stack:
        procs, results, keys = {}, {}, {}
        for pool, concurrency in POOLS.items():
            queue = f"{QUEUE}-lease-{pool}"
            reset_queue(app, url, queue)
            procs[pool] = stack.enter_context(
                process_worker(
                    pool=pool, concurrency=concurrency, env=worker_env(queue, env), broker=url
                )
            )
        stack.enter_context(publishing_to(app, url))
        for pool in POOLS:
            name = f"{t}-{pool}"
            results[pool] = jg.guard_long.apply_async(
                (name,), {"gate": t}, queue=f"{QUEUE}-lease-{pool}"
            )
            keys[pool] = jg.guard_long.job_key((name,), {})
        # Worker start-up included: they start together.
        wait_for(lambda: all(jg.runs(f"{t}-{pool}") for pool in POOLS), timeout=60)
        store = jg.guard_long.store()
        observed_from = time.time()
        expiries: dict[str, set[float]] = {pool: set() for pool in POOLS}
        while time.time() - observed_from < LEASE_SECONDS + 1.0:
            for pool in POOLS:
                info = store.get(keys[pool])
                assert info is not None, f"{pool}: the running job's lock vanished"
                assert info.owner == results[pool].id and info.state == "running", pool
                assert info.expires_at is not None
                expiries[pool].add(info.expires_at)
            time.sleep(0.1)
        for pool in POOLS:
            # Renewed: its expiry moved at least twice and now lies past the first lease.
            assert len(expiries[pool]) >= 3, (pool, sorted(expiries[pool]))
            assert max(expiries[pool]) > observed_from + LEASE_SECONDS, pool

        killed: dict[str, float] = {}
        for pool, proc in procs.items():
            kill_worker(proc)
            killed[pool] = time.monotonic()
        assert all(store.get(keys[pool]) is not None for pool in POOLS)
        gone: dict[str, float] = {}

        def all_gone() -> bool:
            for pool in POOLS:
                if pool not in gone and store.get(keys[pool]) is None:
                    gone[pool] = time.monotonic() - killed[pool]
            return len(gone) == len(POOLS)

        wait_for(all_gone, timeout=LEASE_SECONDS + 3, interval=0.02)
    for pool in POOLS:
        print(f"U5 {pool}: lock gone {gone[pool]:.2f}s after SIGKILL (LEASE_SECONDS=5)")
        report(
            f"lease: lock gone after SIGKILL ({pool})", "redis", "<= 5.0 s", f"{gone[pool]:.2f} s"
        )
        assert gone[pool] <= LEASE_SECONDS + 0.5, (pool, gone[pool])
