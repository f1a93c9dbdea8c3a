"""What the stores' throttling shares (T2-T5): the constants and the limit's text."""

from __future__ import annotations

#: the run duration a waiter's countdown assumes before one was measured (seconds)
ASSUMED_RUN = 1.0


def limit_text(concurrency: int, rate_limit: int, rate_period: float) -> str:
    """The limit as the admin shows it: "concurrency 2", "10/s", "concurrency 2, 10/s"."""
    parts = [f"concurrency {concurrency}"] if concurrency else []
    if rate_limit:
        letter = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(rate_period, f"{rate_period:g}s")
        parts.append(f"{rate_limit}/{letter}")
    return ", ".join(parts)


def margin_ms(rate_limit: int, rate_period: float) -> int:
    """A reserved start lies this much after the start it waits out: slack for the
    worker's timer, a tenth of the spacing of starts, 5 to 50 ms (concurrency alone: 50,
    the shortest wait for a slot)."""
    if not rate_limit:
        return 50
    return int(min(50.0, max(5.0, rate_period * 1000 / rate_limit / 10)))
