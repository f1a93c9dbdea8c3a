"""Where a batch of unique dispatches is fused (L3 with issue 26's fused dispatch,
docs/jobs.md#dispatch-many): every lock of the batch and every winner's message in one round
trip, when a single dispatch of the job would be fused (``jobs/fused.py``).

Each call's message is the one Celery would publish for it: the first is built by Celery
itself and stopped at the channel (``Pending.capture`` in ``jobs/transport.py``); the others
are that message with the call's own fields put in (:class:`Template`: the task id, the
arguments and their reprs, the dedup header, a delivery tag) where nothing else can differ
from call to call (:func:`cloneable`), else each is built by Celery the same way. Then one
pipeline of ``FUSED`` scripts takes each lock and pushes the message of each call whose lock
it took (``RedisFused.acquire_fused_many``). A batch whose messages cannot be fused (nothing
was sent) goes the two-round-trip way of ``jobs/bulk.py``.

Faults (S7): a batch whose store call fails (never sent, its reply lost past the one re-send,
late) raises StoreUnavailable after handing the undo of every call of the failed round trip to
the rollback thread (``undo_fused``: the message taken back off the queue if no worker has it
yet, then the lock; the id marked REVOKED). Calls of earlier round trips (``CHUNK``) stand:
dispatching the batch again is safe, they are duplicates now."""

from __future__ import annotations

from base64 import b64decode, b64encode
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import signals
from celery.app.task import Task
from celery.result import AsyncResult
from celery.utils.saferepr import saferepr
from kombu.exceptions import EncodeError
from kombu.utils.json import loads
from kombu.utils.uuid import uuid

from dedup_jobs import metrics
from dedup_jobs.engine.dispatch import Dispatch
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.jobs.base import HEADER, logger
from dedup_jobs.jobs.calls import Call
from dedup_jobs.jobs.fused import observed, refuse, transport_module, untrail
from dedup_jobs.jobs.undo import undo_fused
from dedup_jobs.signals import lock_acquired, notify
from dedup_jobs.stores.answers import encode_json

if TYPE_CHECKING:  # (imported with kombu's Redis transport, on first use)
    from dedup_jobs.stores.redis.fused import FusedCall

#: calls per store round trip, and bytes of messages: a batch's payloads are written at
#: once, and a write of thousands of messages (or of a few large ones) would outlast the
#: store's time budget (its scripts would then be refused as late, and sent again one by one)
CHUNK, CHUNK_BYTES = 500, 1 << 20


@dataclass(frozen=True)
class Built:
    """One call's message and result; ``cloned``: built from the template (not by Celery,
    which adds a result to its parent task's trail as it builds it)."""

    call: FusedCall
    result: AsyncResult[Any]
    cloned: bool


def dispatch_fused_many(job: Any, store: Any, calls: list[Call], dispatches: list[Dispatch],
                        alias: str, options: dict[str, Any]) -> list[AsyncResult[Any]] | None:
    """The batch's results in order, or None when its messages cannot be fused (nothing
    sent: the caller takes the two-round-trip way)."""
    transport = transport_module()
    why = not_batched(job, calls, options)
    if why:
        logger.debug("%s: a batch not fused (%s): two round trips.", job.name, why)
        return None
    built: list[Built] = []
    template: Template | None = None
    try:
        with job.app.producer_or_acquire(options.get("producer")) as producer:
            sent = {**options, "producer": producer}  # (Celery's messages built on it too)
            for (args, kwargs), d in zip(calls, dispatches, strict=True):
                if template is not None:
                    built.append(template.clone(job, d, args, kwargs, alias, producer))
                    continue
                call, message, result = _captured(job, store, d, args, kwargs, alias, sent)
                built.append(Built(call, result, cloned=False))
                if cloneable(job, message, options):
                    template = Template.of(job, call, message, result, options)
    except transport.Unfusable as exc:
        refuse(job, store, alias, exc)
        return None
    results: list[AsyncResult[Any]] = []
    parent = job.app.current_worker_task if options.get("add_to_parent", True) else None
    for start, chunk in _chunks(built):
        fused = [b.call for b in chunk]
        try:
            answers = store.acquire_fused_many(fused)
        except StoreUnavailable as exc:
            if start == 0 and transport.denied(exc):  # nothing ran (NOPERM): two round trips
                refuse(job, store, alias, exc)
                return None
            for call in fused:  # S7: any call of the round trip may have run
                undo_fused(job, store, call, revoke=True)
            raise
        for b, (args, kwargs), answer in zip(chunk, calls[start:start + len(chunk)], answers,
                                             strict=True):
            observed(job, store, not answer.acquired)
            if not answer.acquired:
                if parent and not b.cloned:  # its own id never published: not a child
                    untrail(parent, b.call.owner)
                results.append(job._duplicate(b.call.key, alias, answer.holder, b.call.owner,
                                              args, kwargs, options))
                continue
            if parent and b.cloned:
                parent.add_trail(b.result)  # as Celery adds the result of what it sends
            notify(lock_acquired, type(job), key=b.call.key.key, owner=b.call.owner,
                   store=alias)
            metrics.decision(job.name, "dispatched")
            b.result.deduplicated = False  # type: ignore[attr-defined]
            results.append(b.result)
    return results


def _chunks(built: list[Built]) -> Iterator[tuple[int, list[Built]]]:
    """``(index of its first call, calls)`` of each store round trip (CHUNK, CHUNK_BYTES)."""
    start, size = 0, 0
    for i, b in enumerate(built):
        if i > start and (i - start >= CHUNK or size + len(b.call.payload) > CHUNK_BYTES):
            yield start, built[start:i]
            start, size = i, 0
        size += len(b.call.payload)
    if built:
        yield start, built[start:]


def not_batched(job: Any, calls: list[Call], options: dict[str, Any]) -> str:
    """Why this batch is not fused although a single dispatch of the job would be ("" when
    it is): a header option that renames its messages, or a router that does not send every
    call where it sends the first (the channel would refuse a later message after earlier
    ones were built, their publish signals sent)."""
    if "id" in (options.get("headers") or {}):
        return "the headers option sets the messages' id"
    router = options.get("router")
    if router is None and not job.app.conf.task_routes:
        return ""
    router = router or job.app.amqp.router
    first = None
    for args, kwargs in calls:
        route = router.route(dict(options), job.name, args, kwargs, job)
        if first is None:
            first = route
        elif route != first:
            return "the router sends its calls to different queues"
    return ""


def _captured(job: Any, store: Any, d: Dispatch, args: Any, kwargs: Any, alias: str,
              options: dict[str, Any]) -> tuple[FusedCall, dict[str, Any], AsyncResult[Any]]:
    """The message Celery builds for one call, stopped at the channel (not sent)."""
    transport = transport_module()
    pending = transport.Pending(store=store, key=d.key, owner=d.task_id, ttl=d.ttl,
                                request=d.request, capture=True)
    token = transport.PENDING.set(pending)
    try:
        result: AsyncResult[Any] = job._publish(args, kwargs, d.task_id, d.key, alias, options)
    finally:
        transport.PENDING.reset(token)
    if pending.call is None or pending.message is None:
        raise transport.Unfusable("the message did not reach dedup_jobs' channel")
    return pending.call, pending.message, result


def cloneable(job: Any, message: dict[str, Any], options: dict[str, Any]) -> bool:
    """Would Celery build every other call's message of this batch as ``message`` with the
    call's own fields put in? Not where something may change a message per call: a handler
    of Celery's publish signals, a task-sent event, a task's own ``shadow_name``, pydantic
    arguments; nor for a body Celery does not write as JSON text in base64. (A router sends
    every call of a fused batch where it sends the first: :func:`not_batched`.)"""
    conf = job.app.conf
    headers = message.get("headers") or {}
    return (not any(s.receivers for s in (signals.before_task_publish,
                                          signals.after_task_publish, signals.task_sent))
            and not conf.task_send_sent_event
            and type(job).shadow_name is Task.shadow_name and not job.__v2_compat__
            and getattr(job, "_dump_pydantic_arguments", None) is None
            and message.get("content-type") == "application/json"
            and message.get("content-encoding") == "utf-8"
            and message["properties"].get("body_encoding") == "base64"
            and "compression" not in headers and headers.get("lang") == "py"
            and headers.get("id") == message["properties"].get("correlation_id")
            and not options.get("argsrepr") and not options.get("kwargsrepr"))


@dataclass(frozen=True)
class Template:
    """A message Celery built for one call of a batch, and what the others take from it."""

    message: dict[str, Any]
    queue: str
    database: int
    embed: Any  # the body's third part: callbacks, errbacks, chain, chord
    own_root: bool  # the root id is the task's own (not dispatched inside another task)
    ignored: bool
    overlay: dict[str, Any]  # the caller's headers option
    repr_sizes: tuple[int, int, int]

    @classmethod
    def of(cls, job: Any, call: FusedCall, message: dict[str, Any], result: Any,
           options: dict[str, Any]) -> Template:
        headers = message["headers"]
        amqp = job.app.amqp
        return cls(message=message, queue=call.queue, database=call.database,
                   embed=loads(b64decode(message["body"]))[2],
                   own_root=headers.get("root_id") == headers["id"],
                   ignored=bool(getattr(result, "ignored", False)),
                   overlay=dict(options.get("headers") or {}),
                   repr_sizes=(amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize,
                               job.app.conf.task_repr_maxlevels))

    def clone(self, job: Any, d: Dispatch, args: Any, kwargs: Any, alias: str,
              producer: Any) -> Built:
        """The call's message, as Celery's ``apply_async`` would build it, and its result."""
        args, kwargs = args or (), kwargs or {}
        if job.typing:  # Celery's own check of the arguments, as apply_async makes it
            job.__header__(*args, **kwargs)
        owner = d.task_id
        headers = dict(self.message["headers"])
        args_size, kwargs_size, levels = self.repr_sizes
        headers.update(id=owner, argsrepr=saferepr(args, args_size, maxlevels=levels),
                       kwargsrepr=saferepr(kwargs, kwargs_size, maxlevels=levels))
        if self.own_root:
            headers["root_id"] = owner
        headers.update(self.overlay)  # the caller's headers, over Celery's (as Celery does)
        headers[HEADER] = d.key.as_header(alias)
        properties = dict(self.message["properties"], correlation_id=owner,
                          delivery_tag=uuid())
        try:
            body = encode_json([args, kwargs, self.embed]).encode("utf-8")
        except Exception as exc:  # what kombu raises for a body it cannot serialise
            raise EncodeError(exc) from exc
        message = dict(self.message, headers=headers, properties=properties,
                       body=b64encode(body).decode("ascii"))
        call: FusedCall = transport_module().FusedCall(
            key=d.key, owner=owner, ttl=d.ttl, request=d.request, queue=self.queue,
            database=self.database, payload=encode_json(message))
        result: AsyncResult[Any] = job.AsyncResult(owner)
        result.ignored = self.ignored
        if not self.ignored:
            job.backend.on_task_call(producer, owner)
        return Built(call, result, cloned=True)
