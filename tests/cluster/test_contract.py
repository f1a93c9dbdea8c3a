"""S5: the store-contract tests of a single Redis, run on a Redis 7 and a Valkey 8 cluster.

The test functions below are the very ones of tests/test_stores.py, tests/test_debounce_store.py,
tests/test_debounce_stale.py (D9, S7's withdraw),
tests/test_flow_store.py, tests/test_idempotent.py, tests/test_idempotent_stores.py,
tests/test_start_fates.py,
tests/test_throttle_store.py and
tests/test_id_hooks.py (U1-U7, P1-P2, D1-D8, R1-R2, S7, T2-T3, A4),
collected again here with this directory's ``store_name`` fixture (tests/cluster/conftest.py):
the CACHES alias "cluster" on django-valkey's cluster cache, on each cluster in turn."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from dedup_jobs.stores import get_store
from tests.test_debounce_stale import (  # noqa: F401 (collected here)
    test_stale_burst_gives_way_to_a_new_one,
    test_withdraw_a_failed_dispatch,
    test_without_max_wait_each_dispatch_is_a_new_due_time,
)
from tests.test_debounce_store import (  # noqa: F401 (collected here)
    test_burst_absorbs_and_claims_latest,
    test_concurrent_dispatches_are_atomic,
    test_deadline_caps_runs_at,
    test_iter_debounces_lists_pending,
    test_missing_and_other,
)
from tests.test_flow_store import (  # noqa: F401 (collected here)
    test_start_exclusive_on_every_store,
    test_take_over_of_an_expired_lock,
    test_take_over_on_every_store,
)
from tests.test_id_hooks import (  # noqa: F401 (collected here)
    test_no_two_pairs_share_a_burst_on_any_store,
    test_no_two_pairs_share_a_lock_on_any_store,
)
from tests.test_idempotent import (  # noqa: F401 (collected here)
    test_a_late_renewal_takes_nothing_back,
    test_release_resent_answers_released,
    test_until_processing_start_resent_is_not_skipped,
)
from tests.test_idempotent_stores import (  # noqa: F401 (collected here)
    test_a_take_over_keeps_the_16_newest_holders_it_replaced,
    test_acquire_past_its_deadline_changes_nothing,
    test_acquire_resent_with_an_explicit_id_answers_taken,
    test_claim_resent_after_a_later_burst_was_claimed,
    test_claim_resent_gets_the_same_latest_arguments_and_ids,
    test_debounce_past_its_deadline_changes_nothing,
    test_debounce_resent_after_absorbing_answers_the_same,
    test_debounce_resent_after_its_burst_ran_starts_nothing,
    test_debounce_resent_by_the_burst_starter_still_publishes,
    test_take_over_past_its_deadline_changes_nothing,
    test_undo_made_again_answers_as_the_first,
    test_undo_of_chained_take_overs_gives_the_lock_back_to_the_first_holder,
)
from tests.test_start_fates import (  # noqa: F401 (collected here)
    test_a_resent_start_past_its_deadline_changes_nothing,
    test_late_start_exclusive_takes_no_running_marker,
    test_late_start_takes_no_lock_for_a_run_that_ended,
    test_late_until_processing_start_changes_nothing,
)
from tests.test_stores import (  # noqa: F401 (collected here)
    test_expired_lock_is_free_again,
    test_reentrant_acquire_refreshes_only_for_the_owner,
    test_release_is_compare_and_delete,
    test_renew_never_shortens_and_only_for_owner,
    test_second_delivery_of_a_running_message_is_live,
    test_worker_start_decides_by_owner,
    test_worker_start_holds_a_queued_lock,
    test_worker_start_resent_answers_as_first,
)
from tests.test_throttle_store import (  # noqa: F401 (collected here)
    test_admission_resent_after_its_task_was_admitted_again,
    test_concurrency_and_rate_together,
    test_concurrency_slots,
    test_late_renewal_never_takes_a_released_slot_back,
    test_rate_sliding_window,
    test_resent_release_answers_as_the_first,
    test_slot_is_a_lease,
    test_waiter_back_for_its_turn_takes_any_free_slot,
    test_waiters_missing_their_turns,
)


@pytest.fixture
def store(store_name: str) -> Iterator[Any]:
    """tests/test_idempotent.py's fixture: the cluster store (S1 on S5)."""
    with override_settings(DEDUP_JOBS={"STORE": store_name, "LEASE_SECONDS": 60}):
        yield get_store(store_name)
