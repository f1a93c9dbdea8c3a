"""One message at the worker, as the engine's decisions see it.

The front-end (a Celery job class) computes it once per delivery, from its request: who owns
the message (its task id), the dedup header it carries, whether the job is in observe-only
mode (R3) and whether the broker (or a copy that waited for it, W5) marked it redelivered.
The decisions read these fields instead of asking the task framework again."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("dedup_jobs")


@dataclass(frozen=True, kw_only=True)
class Message:
    """A delivery being decided."""

    name: str  # the job's registered name (log lines, metrics)
    sender: Any  # the job class (a Django task: the task): the sender of its signals
    owner: str  # its task id: the owner of whatever it holds
    header: Mapping[str, Any] | None = None  # its dedup header (None: published without one)
    observing: bool = False  # R3: decisions are reported, never enforced
    redelivered: bool = False  # W5: the broker redelivered it, or it is a waiting copy

    def carried(self, name: str) -> Any:
        """A field of the dedup header (None when absent or without a header)."""
        return (self.header or {}).get(name)
