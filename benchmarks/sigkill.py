"""Lock lifetime after a SIGKILLed worker: the job runs (its body sleeps), the whole worker is
killed with SIGKILL, and the lock key is watched in Redis until it is gone."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.contenders import Contender
from benchmarks.redisutil import clean, store
from benchmarks.workers import kill, runs, wait_for, worker


@dataclass(frozen=True, kw_only=True)
class Lifetime:
    #: seconds from the kill until the lock was gone (None: still held at the end of the window)
    gone_after: float | None
    #: seconds the lock would still live by its TTL at the end of the window (None: gone)
    ttl_left: float | None
    held_at_kill: bool

    def describe(self, window: float) -> str:
        if not self.held_at_kill:
            return "no lock while running (released at start)"
        if self.gone_after is not None:
            return f"gone {self.gone_after:.1f} s after the kill"
        left = f"{self.ttl_left:.0f}" if self.ttl_left is not None else "?"
        return f"still held {window:.0f} s after the kill (TTL: {left} s more)"


def lock_lifetime(contender: Contender, *, lease: float, window: float) -> Lifetime:
    clean()
    item = 900_000
    key = contender.lock_key(item)
    if key is None:
        raise ValueError(f"{contender.name} takes no lock")
    redis = store()
    with worker(concurrency=1, lease=lease) as proc:
        contender.task.apply_async((item, 120.0))
        wait_for(lambda: runs(contender.name) >= 1, 30, what=f"{contender.name} running")
        time.sleep(0.2)
        held = bool(redis.exists(key))
        kill(proc)
        killed_at = time.monotonic()
        gone_after = None
        while time.monotonic() - killed_at < window:
            if not redis.exists(key):
                gone_after = time.monotonic() - killed_at
                break
            time.sleep(0.05)
        ttl = redis.pttl(key)
    clean()
    if not held:
        return Lifetime(gone_after=0.0, ttl_left=None, held_at_kill=False)
    return Lifetime(
        gone_after=gone_after,
        ttl_left=ttl / 1000 if gone_after is None and ttl > 0 else None,
        held_at_kill=True,
    )


def run_sigkill(
    contenders: list[Contender],
    *,
    lease: float,
    window: float,
    progress: Callable[[str], None] = print,
) -> dict[str, Lifetime]:
    results = {}
    for contender in contenders:
        if contender.family == "plain":
            continue
        results[contender.name] = lock_lifetime(contender, lease=lease, window=window)
        progress(f"  SIGKILL: {contender.name}: {results[contender.name].describe(window)}")
    return results
