"""Store commands per operation, from INFO commandstats deltas (and round trips counted in
redis-py beside them).

Dispatch and duplicate are real ``apply_async`` calls. Worker start and finish run the real
messages (taken off the broker queue) through Celery's tracer, the code a worker runs for each
message, in this process so nothing else talks to Redis meanwhile; the job body takes a
snapshot, which splits the message into "start" (before the body) and "finish" (after it).
The broker's share of a dispatch (what plain Celery needs to publish one message) is
subtracted, so what is left is the store's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from celery.app.trace import build_tracer

from benchmarks import app as bench
from benchmarks.contenders import Contender
from benchmarks.redisutil import RoundTrips, clean, commandstats, pop_message, queue_length

OPS = ("dispatch", "duplicate", "worker start", "finish")


@dataclass(kw_only=True)
class OpCount:
    """One operation, averaged per call."""

    round_trips: float
    commands: Counter[str] = field(default_factory=Counter)
    published: float = 0.0

    def describe(self) -> str:
        names = ", ".join(f"{n} {c:g}" for n, c in sorted(self.commands.items()) if c)
        return f"{self.round_trips:g}" + (f" ({names})" if names else "")


def _per_call(total: Counter[str], n: int) -> Counter[str]:
    return Counter({name: count / n for name, count in total.items() if count})


def _minus(total: Counter[str], part: Counter[str], times: float) -> Counter[str]:
    out = Counter(total)
    for name, count in part.items():
        out[name] -= count * times
    return Counter({n: round(c, 2) for n, c in out.items() if round(c, 2) > 0})


def _measure(counter: RoundTrips, action: object, n: int) -> OpCount:
    published = queue_length()
    before, trips = commandstats(), counter.count
    action()  # type: ignore[operator]
    delta = commandstats() - before
    return OpCount(
        round_trips=(counter.count - trips) / n,
        commands=_per_call(delta, n),
        published=(queue_length() - published) / n,
    )


def count_operations(
    contenders: list[Contender], *, n: int = 40, base: int = 10_000
) -> dict[str, dict[str, OpCount]]:
    """Per contender and operation: store round trips and commands per call."""
    results: dict[str, dict[str, OpCount]] = {}
    broker_share: OpCount | None = None
    bench.RECORD = False
    try:
        with RoundTrips() as counter:
            for contender in contenders:
                clean()
                _load_scripts(contender)
                results[contender.name] = ops = _count_one(contender, counter, n, base)
                if contender.family == "plain":
                    share = ops["dispatch"]
                    broker_share = OpCount(
                        round_trips=share.round_trips,
                        commands=Counter(share.commands),
                        published=share.published,
                    )
                base += 10 * n
        if broker_share is not None:
            for ops in results.values():
                for op in ops.values():
                    _subtract_broker(op, broker_share)
    finally:
        bench.RECORD = True
        bench.SNAPSHOT = None
        clean()
    return results


def _load_scripts(contender: Contender) -> None:
    """Steady state: every script is in the server's script cache before counting (a script
    is loaded once per Redis server; the first decision after a restart or SCRIPT FLUSH pays
    one more round trip, SCRIPT LOAD, and none after)."""
    if contender.family not in ("dedup", "debounce"):
        return
    from dedup_jobs.stores.redis import scripts as lua

    client = contender.task.store().client
    for name in lua.SHA:
        client.script_load(getattr(lua, name))


def _subtract_broker(op: OpCount, share: OpCount) -> None:
    """What plain Celery does to publish one message is the broker's, not the store's."""
    if op.published:
        op.round_trips = round(op.round_trips - op.published * share.round_trips, 2)
        op.commands = _minus(op.commands, share.commands, op.published)


def _count_one(contender: Contender, counter: RoundTrips, n: int, base: int) -> dict[str, OpCount]:
    ops: dict[str, OpCount] = {}
    contender.dispatch(base - 1)  # warm up connections and scripts
    while pop_message() is not None:
        pass
    items = range(base, base + n)
    ops["dispatch"] = _measure(counter, lambda: [contender.dispatch(i) for i in items], n)
    if contender.family == "debounce":
        # Its messages wait for the end of the burst: the worker side is measured by the
        # debounce benchmark (benchmarks/debounce.py), not here.
        while pop_message() is not None:
            pass
    else:
        ops["worker start"], ops["finish"] = _run_queued(contender, counter, n)
    held = base + n + 1
    contender.dispatch(held)
    ops["duplicate"] = _measure(counter, lambda: [contender.dispatch(held) for _ in items], n)
    return ops


def _run_queued(contender: Contender, counter: RoundTrips, n: int) -> tuple[OpCount, OpCount]:
    """Run the n queued messages through Celery's tracer; split each at the job body."""
    task = contender.task
    tracer = build_tracer(task.name, task, app=bench.app, eager=False, propagate=True)
    start: Counter[str] = Counter()
    finish: Counter[str] = Counter()
    trips = {"start": 0, "finish": 0}
    mid: dict[str, object] = {}

    def snapshot() -> None:
        mid["stats"], mid["trips"] = commandstats(), counter.count

    bench.SNAPSHOT = snapshot
    runs = 0
    while (request := pop_message()) is not None:
        mid.clear()
        before, trips0 = commandstats(), counter.count
        tracer(request["id"], request["args"], request["kwargs"], request)
        after, trips1 = commandstats(), counter.count
        if not mid:
            raise RuntimeError(f"{contender.name}: message {request['id']} did not run")
        runs += 1
        start += mid["stats"] - before  # type: ignore[operator]
        finish += after - mid["stats"]  # type: ignore[operator]
        trips["start"] += mid["trips"] - trips0  # type: ignore[operator]
        trips["finish"] += trips1 - mid["trips"]  # type: ignore[operator]
    bench.SNAPSHOT = None
    if runs != n:
        raise RuntimeError(f"{contender.name}: {runs} messages queued, expected {n}")
    return (
        OpCount(round_trips=trips["start"] / n, commands=_per_call(start, n)),
        OpCount(round_trips=trips["finish"] / n, commands=_per_call(finish, n)),
    )
