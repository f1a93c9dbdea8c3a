"""DebouncedJob: only the last dispatch of a burst runs, ``debounce_for`` seconds after it,
and never later than ``max_wait`` after the burst's first dispatch.

Where a dispatch is decided: :meth:`DebouncedJob.apply_async` → ``store.debounce`` (one store
call). The first dispatch of a burst publishes the burst's one message (countdown
``debounce_for``); later ones only update the state and send ``job_debounced`` for the
dispatch they supersede.
Where the worker decides: :meth:`DebouncedJob.__call__` → ``store.claim_due`` (one store
call): not due yet → the message re-publishes itself for when it is due; due → it claims
the state (a later dispatch starts a new burst) and runs with the latest arguments.
Where results go: :func:`dedup_jobs.jobs.absorbed.record_outcome`, under every absorbed id.
Chains (D8): :mod:`dedup_jobs.jobs.chains`. See docs/debounce.md.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any, ClassVar

from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult

from dedup_jobs import clock, metrics
from dedup_jobs.conf import app_settings, is_seconds, not_finite
from dedup_jobs.engine import debounce
from dedup_jobs.engine.limits import debounce_times, seconds_at_worker
from dedup_jobs.engine.rollback import rollbacks
from dedup_jobs.engine.throttle import holding
from dedup_jobs.exceptions import InvalidJobConfiguration, StoreUnavailable
from dedup_jobs.jobs import bursts, chains
from dedup_jobs.jobs.absorbed import FAILURE, SUCCESS, record_outcome, remember_chain
from dedup_jobs.jobs.admission import admit_throttle
from dedup_jobs.jobs.base import DedupJob, logger, new_task_id
from dedup_jobs.jobs.calls import check_limits
from dedup_jobs.jobs.request import finished, is_redelivered
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import job_debounced, notify
from dedup_jobs.stores.base import (
    ADOPTED,
    CLAIMED,
    STATE_GRACE,
    WAIT,
    BaseStore,
    Due,
    encode_call,
)

#: header flags of a message that already owns its burst (a retry of the claimed run)
CLAIMED_FLAG = "claimed"
ABSORBED = "absorbed"
WINNER = "winner"  # the dispatch whose arguments (and chain) the run uses

#: header field: how many times the burst's message was put off because its claim failed
CLAIM_TRIES = "claim_tries"
#: a message whose claim fails (store unavailable) is put off this often, this many seconds
#: each time, before it runs as published (W4): the claim is idempotent (S7), so the next
#: try gets the burst's latest arguments even if the failed one ran in the store
MAX_CLAIM_TRIES = 3
CLAIM_RETRY_SECONDS = 1.0


class DebouncedJob(DedupJob):
    """A job that runs once per burst of dispatches with the same debounce id, with the last
    dispatch's arguments (Laravel's ``DebounceFor``, with a ``max_wait`` that holds)."""

    dedup_kind: ClassVar[str] = "debounce"
    _key_fields_option = "debounce_on"
    _id_hook = "debounce_id"
    _via_option = "debounce_via"

    #: seconds of quiet after the last dispatch before the job runs (required, > 0); or a
    #: method of the call's arguments (L1; None from it: this call is not debounced)
    debounce_for: Any = None
    #: seconds after a burst's first dispatch by which it runs however busy the stream
    #: (>= debounce_for; None: no cap); or a method of the call's arguments (L1)
    max_wait: Any = None
    #: argument names that form the debounce id (default: all arguments of run)
    debounce_on: tuple[str, ...] | None = None
    #: a CACHES alias or "database" (attribute, or a method returning it)
    debounce_via: Any = None

    @classmethod
    def validate_options(cls) -> None:
        label = cls._job_label()
        if getattr(cls, "unique_for", None) is not None or getattr(cls, "unique_on", None):
            raise InvalidJobConfiguration(
                f"{label} is both unique and debounced (it sets unique_for/unique_on). Use "
                f"UniqueJob for uniqueness, or drop those options."
            )
        problem = debounce_problem(cls.debounce_for, cls.max_wait)
        if problem:
            raise InvalidJobConfiguration(f"{label}: {problem}")
        for name in ("without_overlapping", "observe_only", "on_duplicate"):
            value = getattr(cls, name, None)
            if value not in (None, False):
                raise InvalidJobConfiguration(
                    f"{label}: {name} = {value!r} is an option of the unique kinds, not of "
                    f"a DebouncedJob (R1-R3). Remove it, or use UniqueUntilProcessingJob."
                )
        super().validate_options()

    # -- dispatch -----------------------------------------------------------------------

    def apply_async(  # type: ignore[override,unused-ignore]
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        options.update(producer=producer, link=link, link_error=link_error, shadow=shadow)
        publish = super().apply_async
        # The request stack is only consulted when a task id is given (a retry re-sends its own).
        if task_id is not None:
            request = self.request
            if not request.called_directly and task_id == request.id:
                self.retry_slot(args, kwargs)  # T2: its slot, while its arguments keep it
                return publish(args, kwargs, task_id, **self._retry_options(options))
        links = chains.chain_links(options)
        if link or link_error or chains.in_group(options, links) or self.app.conf.task_always_eager:
            # A group or chord counts this very message, and callbacks hang on it: published
            # as it is, it runs (no header, so the worker runs it unchecked). Eager mode runs
            # at once too. A chain link is debounced (D8, see dedup_jobs/jobs/chains.py).
            return self._dispatched(publish(args, kwargs, task_id, **options))
        task_id = task_id or new_task_id()
        key = self.job_key(args, kwargs)
        alias = self.store_alias()
        store = self.store(alias)
        debounce_for, max_wait = self.debounce_times(args, kwargs)
        if debounce_for is None:  # L1: no debounce for this call
            return self._dispatched(publish(args, kwargs, task_id, **options))
        check_limits(self, args, kwargs)  # L1: a limit method's bad value, by name
        if links and not (self.ignore_result or options.get("ignore_result")):
            remember_chain(self.backend, task_id, links)
        try:
            answer = store.debounce(
                key,
                task_id,
                encode_call(args, kwargs, links),
                now=clock.now(),
                debounce_for=debounce_for,
                max_wait=max_wait,
                ttl=STATE_GRACE,
            )
        except StoreUnavailable:
            if app_settings.ON_STORE_ERROR != "enqueue":
                # S7: the dispatch may have started a burst (a lost reply): undo it.
                self._undo_later(store, key, task_id, alias, options)
                raise
            logger.warning(
                "%s[%s]: store %r unavailable, publishing without debouncing "
                "(ON_STORE_ERROR='enqueue').",
                self.name,
                task_id,
                alias,
                exc_info=True,
            )
            return self._dispatched(publish(args, kwargs, task_id, **options))
        if answer.superseded:
            metrics.decision(self.name, "superseded", key.key)
            notify(  # send_robust: a raising receiver fails no dispatch
                job_debounced,
                type(self),
                debounce_id=key.ident,
                superseded_id=answer.superseded,
                by_id=task_id,
                key=key.key,
            )
        if not answer.new:
            return self.AsyncResult(task_id)
        options.pop("eta", None)
        options = self.with_header({**options, "countdown": debounce_for}, key.as_header(alias))
        try:
            return self._dispatched(publish(args, kwargs, task_id, **options))
        except BaseException:
            self._abandon(store, key, task_id, alias, options)
            raise

    def debounce_times(self, args: Any, kwargs: Any) -> tuple[float | None, float | None]:
        """``(debounce_for, max_wait)`` for a call with these arguments (L1: the methods'
        answers for them); debounce_for None: this call is not debounced."""
        return debounce_times(self.name, self.debounce_for, self.max_wait, args, kwargs)

    def _dispatched(self, result: AsyncResult[Any]) -> AsyncResult[Any]:
        metrics.decision(self.name, "dispatched")  # A5: counted once it is published
        return result

    def _undo_later(self, store: BaseStore, key: JobKey, message_id: str, alias: str,
                    options: dict[str, Any]) -> None:
        """Hand the undo of a failed dispatch to the rollback thread (tried until the store
        answers, see :mod:`dedup_jobs.engine.rollback`)."""
        rollbacks.add(f"debounce burst {key.key} of never-published task {message_id}",
                      lambda: self._undo(store, key, message_id, alias, options),
                      store=store, lifetime=STATE_GRACE)

    def _undo(self, store: BaseStore, key: JobKey, message_id: str, alias: str,
              options: dict[str, Any]) -> bool:
        def hand_over(winner: str, due: Due, others: list[str]) -> None:
            # The burst's one message, sent for the dispatches the failed one's burst
            # absorbed: claimed already (the worker runs it as a claimed burst's retry).
            header = {**key.as_header(alias), CLAIMED_FLAG: True, ABSORBED: others,
                      WINNER: winner}
            sent = {k: v for k, v in options.items() if k not in ("producer", "eta")}
            quiet = seconds_at_worker(self.name, "debounce_for", self.debounce_for,
                                      due.args, due.kwargs, 0.0)
            sent = self.with_header({**sent, "countdown": quiet}, header)
            super(DebouncedJob, self).apply_async(tuple(due.args), dict(due.kwargs), winner,
                                                  **sent)

        return bursts.undo(self, store, key, message_id, hand_over)

    def _abandon(self, store: BaseStore, key: JobKey, message_id: str, alias: str,
                 options: dict[str, Any]) -> None:
        """Publishing the burst's message failed: take its state back, so that the next
        dispatch starts a burst that does get a message (later, if the store cannot answer
        now); dispatches absorbed meanwhile get a message of their own."""
        try:
            self._undo(store, key, message_id, alias, options)
        except StoreUnavailable:
            self._undo_later(store, key, message_id, alias, options)

    def cancel_burst(
        self, message_id: str, header: dict[str, Any], chain: chains.Links | None = None
    ) -> None:
        """The burst's message was revoked or expired: the burst is cancelled. Its state goes
        (the next dispatch starts a new burst, instead of joining one that will never run)
        and every dispatch it had absorbed ends REVOKED too, with the later links of every
        chain in it (``chain``: the message's own)."""
        reason = f"debounce burst cancelled: its message {message_id} was revoked"
        if header.get(CLAIMED_FLAG):  # a claimed burst's retry: its state went at the claim
            owed = [i for i in header.get(ABSORBED) or () if i != message_id]
            bursts.revoke_owed(self, owed, reason)
            return
        try:
            due = debounce.take(self.store(str(header["via"])), self.key_from_header(header),
                              message_id)
        except StoreUnavailable:
            logger.warning(
                "%s[%s]: could not cancel the debounce state of the revoked message.",
                self.name,
                message_id,
                exc_info=True,
            )
            return
        if due is None:
            return
        bursts.revoke(self, due, reason, skip=message_id)
        chains.revoke_links(self.backend, list(chain or ()),
                            f"the chain of dispatch {message_id} does not go on: {reason}")

    def _retry_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """A retry of a claimed run keeps its burst: flagged claimed (no new debounce), with
        the ids whose results it still owes."""
        header = self.header()
        if header is None:
            return options
        request = self.request
        absorbed = getattr(request, "dedup_absorbed", None) or header.get(ABSORBED) or []
        winner = getattr(request, "dedup_winner", None) or header.get(WINNER)
        claimed = {CLAIMED_FLAG: True, ABSORBED: absorbed, WINNER: winner}
        return self.with_header(options, {**header, **claimed})

    # -- worker -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        header = self.header()
        if header is None:
            metrics.decision(self.name, "ran")
            return self.run(*args, **kwargs)  # send_task, a canvas link, or store down
        if header.get(CLAIMED_FLAG):
            absorbed = list(header.get(ABSORBED) or ())
            return self._run_burst(args, kwargs, absorbed, header.get(WINNER))
        key, alias = self.key_from_header(header), str(header["via"])
        owner = str(request.id)
        if is_redelivered(request, header) and finished(self, owner):
            # W5: the broker redelivered the burst's message after its run ended: dropped.
            logger.info("%s[%s]: redelivered copy of a finished run dropped.", self.name, owner)
            raise Ignore()
        try:
            due = self.store(alias).claim_due(key, owner, now=clock.now())
        except StoreUnavailable:
            tries = int(header.get(CLAIM_TRIES) or 0)
            if tries < MAX_CLAIM_TRIES:
                logger.warning(
                    "%s[%s]: store %r unavailable at the debounce check; trying again in "
                    "%.1fs.", self.name, owner, alias, CLAIM_RETRY_SECONDS, exc_info=True)
                self._reschedule(args, kwargs, {**header, CLAIM_TRIES: tries + 1},
                                 clock.now() + CLAIM_RETRY_SECONDS)
            logger.warning(
                "%s[%s]: store %r unavailable at the debounce check; running.",
                self.name,
                owner,
                alias,
                exc_info=True,
            )
            metrics.decision(self.name, "ran")
            return self.run(*args, **kwargs)
        if due.action == WAIT:
            self._reschedule(args, kwargs, header, float(due.wait_until or 0))
        if due.action == ADOPTED:
            # D9: this message came after its burst went stale; the newer burst that adopted
            # its ids runs once for them all and records the outcome under this id too.
            logger.info("%s[%s]: its stale burst %s was taken over by a newer one; dropped.",
                        self.name, owner, key.key)
            raise Ignore()
        if due.action != CLAIMED:
            # D7: the state is gone (flushed, evicted) or belongs to a newer burst: fail open.
            logger.warning(
                "%s[%s]: debounce state %s is %s; running the message as published.",
                self.name,
                owner,
                key.key,
                due.action,
            )
            metrics.decision(self.name, "ran")
            return self.run(*args, **kwargs)
        # Retries of this run re-send the latest arguments, not the first dispatch's, and
        # the chain that goes on after it is the latest dispatch's (D8).
        request.args, request.kwargs = list(due.args), dict(due.kwargs)
        winner = due.latest_id or owner
        chains.follow_winner(self.backend, request, owner, winner, chains.links_of(due.args))
        others = [i for i in due.absorbed if i != owner]
        return self._run_burst(due.args, due.kwargs, others, winner)

    def _reschedule(self, args: Any, kwargs: Any, header: dict[str, Any], until: float) -> None:
        """A later dispatch moved the burst: this message re-publishes itself (same id) for
        when the burst is due, and ends without a result."""
        metrics.decision(self.name, "deferred")
        self.publish_again(args, kwargs, max(0.0, until - clock.now()),
                           lambda options: self.with_header(options, header))
        raise Ignore()

    def _wait_claimed(self, args: Any, kwargs: Any, countdown: float) -> None:
        """Publish the claimed burst again (same id) to run after ``countdown`` (T2/T3)."""
        self.publish_again(args, kwargs, countdown, self._retry_options)

    def _run_burst(
        self, args: Sequence[Any], kwargs: dict[str, Any], others: list[str], winner: str | None
    ) -> Any:
        """Run with the burst's latest arguments; record the outcome under ``others`` (every
        absorbed id but this message's own, which Celery records) and end the chains of the
        superseded ones (D8)."""
        request = self.request
        metrics.decision(self.name, "ran")
        request.dedup_absorbed = others  # type: ignore[attr-defined]
        request.dedup_winner = winner  # type: ignore[attr-defined]
        # the others' answers are kept unless the job ignores results: a per-call
        # ignore_result is the burst's first dispatch's, not theirs (D4)
        keep = not self.ignore_result
        # T2/T3: the claimed burst waits for a slot or a start, re-published with its
        # latest arguments, claimed (later dispatches start a new burst, as during a run)
        slot = admit_throttle(self, args, kwargs, lambda countdown: self._wait_claimed(
            args, kwargs, countdown))
        try:
            with holding(slot, type(self), request, keep_on=(Retry,), wake=self.waker()):
                result = self.run(*args, **kwargs)
        except (Retry, Ignore):
            raise  # a retry carries ``others`` in its header; Ignore means hands off
        except Reject as exc:
            if keep and not getattr(exc, "requeue", False):
                self._record(others, winner, exc, FAILURE, traceback.format_exc())
            raise
        except BaseException as exc:
            if keep:
                self._record(others, winner, exc, FAILURE, traceback.format_exc())
            raise
        if keep:
            self._record(others, winner, result, SUCCESS)
        return result

    def _record(
        self, others: list[str], winner: str | None, outcome: Any, state: str, tb: Any = None
    ) -> None:
        found = record_outcome(self.backend, others, outcome, state, tb)
        if found:
            chains.end_superseded(self.backend, found, winner, str(self.request.id))


def debounce_problem(debounce_for: Any, max_wait: Any) -> str | None:
    """What is wrong with a pair of debounce options, or None."""
    if max_wait is not None and not callable(max_wait) and (
            not is_seconds(max_wait) or max_wait <= 0):
        return (f"max_wait = {max_wait!r} must be a number of seconds above 0 (or None for "
                f"no cap){not_finite(max_wait)}.")
    if callable(debounce_for):  # L1: checked per call, with max_wait
        return None
    if debounce_for is None:
        return (
            "debounce_for is not set. Give the seconds of quiet before the job runs, "
            "e.g. debounce_for=30."
        )
    if not is_seconds(debounce_for) or debounce_for <= 0:
        return (f"debounce_for = {debounce_for!r} must be a number of seconds above 0"
                f"{not_finite(debounce_for)}.")
    if max_wait is None or callable(max_wait):
        return None
    if max_wait < debounce_for:
        return (
            f"max_wait = {max_wait!r} is less than debounce_for = {debounce_for!r}: "
            f"the cap would cut every burst short. Set max_wait >= debounce_for, or "
            f"None for no cap."
        )
    return None
