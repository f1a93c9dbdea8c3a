"""R1 under W4 (issue 21, found by tests/test_fates_property.py: "dispatch(U); start(fate=
'never'); dispatch(U, on_duplicate='replace'); start() → 2 runs of the U key at once"): the
lock check of a replace job that cannot reach the store must not run the body, since the
store still holds its lock as "queued" and a later dispatch may replace it and run beside
it. A private redis-server behind a proxy that swallows every request of the worker (nothing
runs) while the test dispatches through the server directly; a real prefork worker
(tests.faults.settings_faults: LEASE_SECONDS 3, STORE_TIMEOUT 1)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.jobs import bodies, fault_replace, marks, overlaps
from tests.faults.proxy import Proxy
from tests.faults.servers import RedisServer
from tests.faults.test_worker_fates import BODY, _ready, _table, fault_worker
from tests.guard_support import token
from tests.workers import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.worker]


def test_replace_never_runs_beside_a_holder_whose_check_got_no_answer(
        app: Any, private_redis: RedisServer, store_proxy: Proxy) -> None:
    """R1, W7, W4: the first message's check never reaches the store (the store keeps its
    lock "queued"); a replace dispatch then takes the lock over and its message runs. The
    first message waits for the store (W7's deferral, reason "store_error") instead of
    running under W4: it is replaced (REVOKED, never runs) or, had its re-sent check landed
    first, it runs and the replace dispatch is deduplicated onto it. Never two bodies of the
    key at once."""
    t = token()
    with fault_worker(store_proxy, fault_replace):
        store_proxy.blackhole()
        first = fault_replace.delay(t, 1, seconds=BODY)
        # The worker decided on the first message: its body ran (W4) or it was re-published
        # to wait for the store (its second delivery arrived). Its check may not show the
        # token to the proxy: a child without a connection yet times out on the handshake.
        wait_for(lambda: bodies(t) or len(
            [m for m in marks(t, "delivery") if m["task_id"] == first.id]) >= 2, timeout=30)
        assert store_proxy.swallowed, "the worker's check reached the store"
        second = fault_replace.delay(t, 2, seconds=0.2)  # through the server itself
        store_proxy.pass_through()
        ready = _ready([first, second], BODY + 30)
        rows = _table(t)
    assert not overlaps(t), (
        f"two bodies of one unique key at once (value, start, end): {rows}; the second "
        f"dispatch {'was deduplicated' if second.deduplicated else 'replaced the first'}")
    assert ready and len(rows) == 1, rows
    if second.deduplicated:
        assert first.result == 1
    else:
        assert first.state == "REVOKED" and second.result == 2
