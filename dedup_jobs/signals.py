"""Signals sent by dedup_jobs. Every signal is sent with ``sender=`` the task class and
keyword arguments only."""

from __future__ import annotations

from django.dispatch import Signal

# A dispatch or a message was not run because another copy holds the lock.
# kwargs: task_id (the skipped dispatch/message), holder_id (owner of the lock), key,
# stage ("dispatch" or "worker").
unique_job_skipped = Signal()

# A dispatch of a DebouncedJob was superseded by a later one of the same burst.
# kwargs: debounce_id, superseded_id, by_id, key.
job_debounced = Signal()

# A lock was taken. kwargs: key, owner, store (the store alias).
lock_acquired = Signal()

# A lock was released by its owner or an operator. kwargs: key, owner, store,
# reason ("success", "failure", "processing", "admin" or "command").
lock_released = Signal()

# A running job's lease found its lock held by another owner (the lock had vanished and the key
# was taken meanwhile): the lease stops, the other owner's lock is left alone, the body runs on.
# kwargs: key, owner (the running job's task id), store (the store alias), holder (the other
# owner), observed (False; True only in observe-only mode, which does not exist yet).
# Sent from the lease's own thread (prefork, threads, solo) or, under gevent and eventlet, from
# a green thread of the worker once the hub runs (see docs/signals.md).
lock_lost = Signal()
