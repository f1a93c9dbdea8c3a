"""D8: a DebouncedJob that is a link of a chain is debounced like any dispatch, with a real
worker on the real Redis broker and result backend, on every store."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import chain, chord, states
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult
from django.core.cache import caches

from tests import jobs_debounce as jobs
from tests.workers import thread_worker, wait_for, wait_idle

pytestmark = [pytest.mark.redis, pytest.mark.worker]

link = jobs.debounce_link
step = jobs.chain_step


@pytest.fixture(autouse=True)
def _empty_locmem() -> None:
    caches["locmem"].clear()


def _revoked(result: AsyncResult[Any], naming: str) -> None:
    """``result`` ends REVOKED (ready: its get() never waits), the reason naming ``naming``
    (get() raises the chain's first error: the head's, when the run failed)."""
    result.get(timeout=15, propagate=False)
    assert result.state == states.REVOKED
    assert isinstance(result.result, TaskRevokedError)
    assert naming in str(result.result)


def _pending_state(item: int) -> Any:
    return link.store().get_debounce(link.job_key((item, 0), {}))


def test_superseded_chain_head_does_not_continue(app: Any, store_name: str) -> None:
    """D8 (Laravel's testSupersededDebouncedJobDoesNotDispatchChain): a chain whose head is
    superseded by a later dispatch continues nowhere: the head's body does not run with its
    own arguments, the tail never runs and ends REVOKED naming the winning dispatch; the
    head's own result is the run's (D4)."""
    with thread_worker(app):
        tail = chain(link.si(1, 1), step.s("tail")).delay()
        winner = link.delay(1, 2)
        assert winner.get(timeout=15) == 2
        _revoked(tail, naming=winner.id)
        with pytest.raises(TaskRevokedError, match=winner.id):
            tail.get(timeout=5)
        assert tail.parent is not None and tail.parent.get(timeout=5) == 2
        wait_idle(app)  # nothing left to run: a tail that wrongly continued has run
    assert jobs.values("link") == [[1, 2]]
    assert jobs.values("step") == []


def test_winning_chain_continues_with_the_run_result(app: Any, store_name: str) -> None:
    """D8: when the last dispatch of a burst is a chain's head, its chain continues after the
    run, with the run's result; the earlier plain dispatch's result is the run's too."""
    with thread_worker(app):
        loser = link.delay(2, 1)
        tail = chain(link.si(2, 2), step.s("tail")).delay()
        assert tail.get(timeout=15) == "tail:2"
        assert loser.get(timeout=5) == 2
        assert tail.parent is not None and tail.parent.get(timeout=5) == 2
    assert jobs.values("link") == [[2, 2]]
    assert jobs.values("step") == [["tail", 2]]


def test_only_the_last_of_several_chains_continues(app: Any, store_name: str) -> None:
    """D8: three chains with the same debounce id at their head: the job runs once with the
    last one's arguments; only the last chain continues; the first (the burst's message) and
    the middle one (absorbed, then superseded) end REVOKED, naming the winning dispatch and
    the run that absorbed them; every result is ready."""
    with thread_worker(app):
        tails = [chain(link.si(3, i), step.s(f"tail-{i}")).delay() for i in (1, 2, 3)]
        heads = [t.parent for t in tails]
        assert tails[2].get(timeout=15) == "tail-3:3"
        assert heads[0] is not None and heads[2] is not None
        for tail in tails[:2]:
            _revoked(tail, naming=heads[2].id)
        _revoked(tails[1], naming=heads[0].id)  # the run: the burst's message
        assert [h.get(timeout=5) for h in heads if h is not None] == [3, 3, 3]
        wait_idle(app)  # nothing left to run: a tail that wrongly continued has run
    assert jobs.values("link") == [[3, 3]]
    assert jobs.values("step") == [["tail-3", 3]]


def test_later_link_is_debounced(app: Any, store_name: str) -> None:
    """D8: a DebouncedJob as a later link of a chain (dispatched by the worker when the link
    before it finished) is debounced too: superseded by a plain dispatch, it does not run with
    its own arguments and the links after it end REVOKED; the links before it ran."""
    with thread_worker(app):
        tail = chain(step.si(None, "first"), link.si(4, 1), step.s("tail")).delay()
        wait_for(lambda: _pending_state(4), timeout=15)
        winner = link.delay(4, 2)
        assert winner.get(timeout=15) == 2
        _revoked(tail, naming=winner.id)
        assert tail.parent is not None and tail.parent.get(timeout=5) == 2
        wait_idle(app)  # nothing left to run: a tail that wrongly continued has run
    assert jobs.values("link") == [[4, 2]]
    assert jobs.values("step") == [["first", None]]


def test_later_link_wins_and_continues(app: Any, store_name: str) -> None:
    """D8: a later link that is the last dispatch of its burst wins: the run uses its
    arguments and its chain continues with the run's result."""
    with thread_worker(app):
        loser = link.delay(5, 1)
        tail = chain(step.si(None, "first"), link.si(5, 2), step.s("tail")).delay()
        assert tail.get(timeout=15) == "tail:2"
        assert loser.get(timeout=5) == 2
    assert jobs.values("link") == [[5, 2]]
    assert sorted(jobs.values("step")) == [["first", None], ["tail", 2]]


def test_single_chain_is_debounced_and_continues(app: Any, store_name: str) -> None:
    """D8: a chain dispatched once (nothing supersedes it) is debounced like any dispatch (it
    runs debounce_for after it was dispatched) and continues with its result."""
    with thread_worker(app):
        dispatched_at = time.time()
        tail = chain(link.si(6, 7), step.s("tail")).delay()
        assert tail.get(timeout=15) == "tail:7"
    ((started, value),) = jobs.runs("link")
    assert value == [6, 7]
    assert started >= dispatched_at + 0.6 - 0.05
    assert jobs.values("step") == [["tail", 7]]


def test_failed_run_fails_the_winning_chain(app: Any, store_name: str) -> None:
    """D8/D4: when the run fails, the winning chain's later links end FAILURE (as for any
    failed chain link) and the superseded chain's end REVOKED; nothing waits forever."""
    with thread_worker(app):
        lost = chain(link.si(7, 1), step.s("lost")).delay()
        won = chain(link.si(7, -1), step.s("won")).delay()
        with pytest.raises(ValueError, match="boom -1"):
            won.get(timeout=15)  # the head's error, raised as soon as the head failed
        won.get(timeout=15, propagate=False)  # the later link is ready too
        assert won.state == states.FAILURE
        assert won.parent is not None
        _revoked(lost, naming=won.parent.id)
        wait_idle(app)  # nothing left to run: a tail that wrongly continued has run
    assert jobs.values("link") == [[7, -1]]
    assert jobs.values("step") == []


def test_cancelled_burst_ends_every_chain(app: Any, store_name: str) -> None:
    """D8/D4: a burst whose message expires is cancelled: every chain of it ends REVOKED (its
    head and its later links), none of their later links run."""
    with thread_worker(app):
        tails = [chain(link.si(8, 1), step.s("tail-1")).apply_async(expires=0.3)]
        tails += [chain(link.si(8, i), step.s(f"tail-{i}")).delay() for i in (2, 3)]
        for tail in tails:
            with pytest.raises(TaskRevokedError):
                tail.get(timeout=15)
            assert tail.parent is not None
            with pytest.raises(TaskRevokedError):
                tail.parent.get(timeout=5)
        wait_idle(app)  # nothing left to run: a tail that wrongly continued has run
    assert jobs.values("link") == []
    assert jobs.values("step") == []


def test_in_a_chord_it_is_published_as_it_is(app: Any, store_name: str) -> None:
    """D8: in a group or chord (also at the head of a chain inside a chord header) a
    DebouncedJob is published as it is: every member runs with its own arguments and the
    chord body gets every result."""
    with thread_worker(app):
        body = chord(
            [chain(link.si(9, 1), step.s("member")), link.si(9, 2)], step.s("body")
        ).delay()
        assert body.get(timeout=15) == "body:['member:1', 2]"
    assert sorted(jobs.values("link")) == [[9, 1], [9, 2]]


def test_retried_run_continues_the_winning_chain(app: Any, store_name: str) -> None:
    """D8/D4: a run that retries keeps the burst and the winner's chain: the retry runs with
    the latest arguments and then the winning chain continues; the other chain ends REVOKED."""
    retry = jobs.debounce_retry
    with thread_worker(app):
        lost = chain(retry.si(10, 1), step.s("lost")).delay()
        won = chain(retry.si(10, 2), step.s("won")).delay()
        assert won.get(timeout=15) == "won:2"
        assert won.parent is not None
        _revoked(lost, naming=won.parent.id)
        wait_idle(app)  # nothing left to run: a tail that wrongly continued has run
    assert jobs.values("retry") == [[2, 0], [2, 1]]
    assert jobs.values("step") == [["won", 2]]


def test_ignore_result_chain_head(app: Any, store_name: str) -> None:
    """D8: a job with ignore_result stores no result of its own, yet a superseded chain
    head's later links end REVOKED and the winner's chain continues with the run's return
    value."""
    quiet = jobs.debounce_quiet
    with thread_worker(app):
        lost = chain(quiet.si(11, 1), step.s("lost")).delay()
        won = chain(quiet.si(11, 2), step.s("won")).delay()
        assert won.get(timeout=15) == "won:2"
        assert won.parent is not None
        _revoked(lost, naming=won.parent.id)
    assert jobs.values("quiet") == [2]
