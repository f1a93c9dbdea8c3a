"""The broker half of the fused dispatch (issue 26, docs/semantics.md#fused): kombu's Redis
transport, whose channel hands a unique dispatch's message to the store's ``FUSED`` script
instead of pushing it itself, when the dispatch asked for it (``PENDING``) and the message goes
where one LPUSH on the store's own server puts it. Opt in by naming the transport in
settings::

    CELERY_BROKER_TRANSPORT = "dedup_jobs.transport:Transport"

Every other message (no fused dispatch pending, and every message of a worker) is published
as kombu's own Redis transport publishes it. Where the message cannot be fused (an exchange
other than Celery's default direct routing, a queue with an expiry, a global key prefix, a
publish batch, another server), the channel raises :class:`Unfusable` before anything is sent,
and the dispatch takes the two-round-trip path (``jobs/fused.py``)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.answers import Acquired
from dedup_jobs.stores.redis.fused import FusedCall


class Unfusable(Exception):
    """This message cannot be fused; raised before anything was sent."""


@dataclass(kw_only=True, eq=False)
class Pending:
    """A unique dispatch waiting for its message: the channel fills ``call`` (what it sent)
    and ``answer`` (the store's)."""

    store: Any  # a RedisStore (dedup_jobs.stores.redis.fused.RedisFused)
    key: Any
    owner: str
    ttl: float
    request: str
    call: FusedCall | None = None
    answer: Acquired | None = field(default=None)
    #: a batch's message (``jobs/fused_many.py``): the channel only fills ``call`` and
    #: ``message`` (the final message, as kombu would push it); the batch sends it
    capture: bool = False
    message: dict[str, Any] | None = None


#: the fused dispatch under way in this thread (or task), read by the channel
PENDING: ContextVar[Pending | None] = ContextVar("dedup_jobs_fused", default=None)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; a message published while a fused dispatch is pending goes
    through the store's FUSED script."""

    _dedup_server: str | None = None

    def basic_publish(self, message: Any, exchange: Any, routing_key: Any, **kwargs: Any) -> Any:
        pending = PENDING.get()
        if (pending is None or pending.call is not None
                or (message.get("headers") or {}).get("id") != pending.owner):
            # not the pending dispatch's own message (one published by a before_task_publish
            # handler, say, while the dispatch is under way): kombu's own way
            return super().basic_publish(message, exchange, routing_key, **kwargs)
        why = self._unfusable(exchange, routing_key, kwargs, pending)
        if why:
            raise Unfusable(why)
        channel: Any = self  # kombu's private helpers, as its own _put uses them
        channel._inplace_augment_message(message, exchange, routing_key)
        priority = self._get_message_priority(message, reverse=False)
        pending.call = FusedCall(
            key=pending.key, owner=pending.owner, ttl=pending.ttl, request=pending.request,
            queue=channel._q_for_pri(routing_key, priority),
            database=int(self.pool.connection_kwargs.get("db") or 0), payload=dumps(message))
        if pending.capture:
            pending.message = message
            return None
        try:
            pending.answer = pending.store.acquire_fused(pending.call)
        except StoreUnavailable as exc:
            if denied(exc):
                raise Unfusable(f"the store's Redis user may not run it ({exc.__cause__})") from exc
            raise
        return None

    def _unfusable(self, exchange: Any, routing_key: Any, kwargs: dict[str, Any],
                   pending: Pending) -> str:
        """Why this message cannot go through the FUSED script ("" when it can)."""
        if exchange:
            return f"exchange {exchange!r}: only the default direct routing is fused"
        if kwargs.get("_publish_batch") is not None:
            return "a publish batch"
        expires = getattr(self, "_expires", None)
        if expires and routing_key in expires:
            return f"queue {routing_key!r} expires"
        if self.global_keyprefix:
            return "the transport's global_keyprefix"
        broker, store = self.server_id(), pending.store.server_id()
        if not broker or not store:
            return "the Redis server cannot be named (INFO refused, renamed, or no run_id)"
        if broker != store:
            return "the broker and the store are different Redis servers"
        return ""

    def server_id(self) -> str:
        """The broker's server (INFO's run_id), read once per channel; "" when the server
        cannot be named (INFO refused to an ACL user without @dangerous, or renamed)."""
        if self._dedup_server is None:
            with self.conn_or_acquire() as client:
                try:
                    self._dedup_server = str(client.info("server")["run_id"])
                except (redis.ResponseError, KeyError, TypeError):
                    self._dedup_server = ""
        return self._dedup_server


def denied(exc: BaseException) -> bool:
    """Did the server refuse a fused call for the store's Redis user's permissions (NOPERM:
    its keys are checked before the script runs, and its one command that could be denied
    before any write is the SELECT of the broker's database)? Nothing of it ran: the job
    takes two round trips, each as its own connection's user."""
    cause = exc.__cause__ or exc
    return type(cause).__name__ == "NoPermissionError" or "NOPERM" in str(cause)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with the fused dispatch's channel."""

    Channel = Channel
