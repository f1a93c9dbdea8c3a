"""What the stores' throttling shares (T2-T5): the constants and the limit's text."""

from __future__ import annotations

#: the shortest run a waiter's countdown assumes before one was measured (seconds): until
#: then a run is expected to last as long again as the oldest running one has so far
ASSUMED_RUN = 0.1

#: a waiter's turn (T2) is planned this many average runs (plus TURN_PAD seconds) after the
#: turn it follows on its slot: longer than a run on purpose, so that a waiter back for its
#: turn finds a slot free (the price: the drain of a backlog runs below the slots' full rate)
TURN_FACTOR = 1.2
TURN_PAD = 0.005

#: while a waiter misses its turn (the broker holds it back behind a burst of newer
#: messages), a message deferred meanwhile is planned at least this many times that
#: waiter's lateness from now (at most LEASE_SECONDS / 12): to come back after the burst
HELD_BACK = 4


#: a release calls the waiter of the earliest turn when that turn is more than this many
#: seconds away (the runs ended sooner than the plan said): the front-end brings its held
#: message forward (Celery: the ``dedup_jobs_wake`` worker command), so a freed slot does
#: not idle until the planned turn. A turn sooner than this is left to come by itself.
WAKE_AFTER = 0.1

#: where waiters are woken (the Celery front-end on a store that can wake), a waiter's turn is
#: planned this many steps after the one it follows when that puts it more than WAKE_AFTER
#: later: a turn planned too late costs nothing then (the release calls the waiter), one
#: planned too early costs a deferral more. Runs shorter than that keep the plain plan.
WAKE_STRETCH = 2


def limit_text(concurrency: int, rate_limit: int, rate_period: float) -> str:
    """The limit as the admin shows it: "concurrency 2", "10/s", "concurrency 2, 10/s"."""
    parts = [f"concurrency {concurrency}"] if concurrency else []
    if rate_limit:
        letter = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(rate_period, f"{rate_period:g}s")
        parts.append(f"{rate_limit}/{letter}")
    return ", ".join(parts)


def margin_ms(rate_limit: int, rate_period: float) -> int:
    """A reserved start lies this much after the start it waits out (ms): slack for the
    lateness of worker timers, so that a reserved message is admitted when it comes back
    rather than deferred again; 5% of the period, 20 to 200 ms (at most 5% fewer starts than
    the rate allows). Concurrency alone: 50, the shortest wait for a slot."""
    if not rate_limit:
        return 50
    return int(min(200.0, max(20.0, rate_period * 1000 * 0.05)))
