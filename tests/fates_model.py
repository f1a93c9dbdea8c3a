"""The three fates of a store call (SPEC S7, W4, W7; issue 21), for tests/test_fates_property.py.

:class:`Fates` injects a fate at the client side of one store call: ``ok`` (answered),
``resent`` (executed, the reply lost, the client's one re-send answered: S7), ``never``
(StoreUnavailable before sending), ``lost`` (executed, then StoreUnavailable) and ``late``
(StoreUnavailable now; the call lands at a later step, after its caller gave up: a decision that
carries a deadline, a Redis script, a cache store's write, a database statement, is run past it
and must change nothing).
It also counts the fates it dealt, per store, for the closing note.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.base import BaseStore

FATES = ("ok", "resent", "never", "lost", "late")
FAILING = ("never", "lost", "late")

#: fates dealt so far, by store name (printed and recorded by the test)
DEALT: dict[str, Counter[str]] = {}


@dataclass
class Late:
    """A call whose caller already saw StoreUnavailable; it lands when :meth:`Fates.land`."""

    what: str
    call: Callable[[], Any]
    owner: str  # the task id the call was made for
    after: Callable[[Any], None] | None = None  # what the landing's answer means to the model


@dataclass
class Fates:
    """Deals fates to the store calls of one state machine run on ``store``."""

    store: BaseStore
    name: str
    late: list[Late] = field(default_factory=list)

    def call(self, fate: str, what: str, call: Callable[[], Any], owner: str,
             after: Callable[[Any], None] | None = None) -> Any:
        """Make ``call`` with ``fate``: its answer, or StoreUnavailable as the fate says."""
        if fate not in held_fates(self.name):  # an open fate of this store (OPEN)
            fate = "never" if fate in FAILING else "ok"
        DEALT.setdefault(self.name, Counter())[fate] += 1
        if fate == "ok":
            return call()
        if fate == "resent":
            call()  # the reply is lost: the client sends the same call again (S7)
            return call()
        if fate == "lost":
            call()
        elif fate == "late":
            self.late.append(Late(what, call, owner, after))
        raise StoreUnavailable(self.store.alias, f"injected fate {fate!r} of {what}")

    def land(self, index: int) -> tuple[Late, Any]:
        """The late call ``index`` reaches the store now, past its caller's deadline."""
        late = self.late.pop(index)
        with past_deadline(self.store):
            try:
                answer = late.call()
            except StoreUnavailable as exc:  # refused as late (twice): nothing changed
                answer = exc
        return late, answer


@contextlib.contextmanager
def past_deadline(store: BaseStore) -> Iterator[None]:
    """Run a call as if it reached the server after its caller's deadline (STORE_TIMEOUT):
    the store's decisions that carry a deadline (``deadline_ms``: the Redis family's scripts,
    the cache stores' writes, the database store's statements) get one that has passed."""
    own = getattr(store, "deadline_ms", None)
    if own is None:
        yield
        return
    skew = store.skew_ms  # type: ignore[attr-defined]
    store.deadline_ms = lambda: int(time.time() * 1000) - 1000  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del store.deadline_ms  # type: ignore[attr-defined]
        store.skew_ms = skew  # type: ignore[attr-defined]


def supports(store: BaseStore, method: str) -> bool:
    """The store implements ``method`` (take_over, start_exclusive) itself."""
    return getattr(type(store), method) is not getattr(BaseStore, method)


# -- the model's constants and records (tests/test_fates_property.py, tests/fates_worker.py) --

UNIQUE_FOR = 600.0
LEASE = 60.0
#: a concurrency slot's lease: short, since a deferred message's turn is planned on the
#: store's clock at most a third of it ahead, and draining the queue waits for those turns
SLOT_LEASE = 6.0
SLOTS = 2  # the T key's concurrency
DEBOUNCE_FOR = 5.0
STATE_GRACE = 3600.0
READY = ("SUCCESS", "REVOKED")
SLACK = 2.0  # seconds of clock difference allowed when reading an expiry
SEARCH = int(os.environ.get("DEDUP_JOBS_FATES_SEARCH", "0"))
EXAMPLES = int(os.environ.get("FATES_EXAMPLES", "200"))

#: The fates dealt by default (CI): every fate on every store. A store that cannot hold one
#: yet is listed here by name prefix with the fates it holds (a failing fate is then dealt as
#: "never", the re-send as "ok"). Empty since the database store holds all five (issue 21:
#: its worker checks and a renewal's take-back carry a deadline, a take-over keeps the
#: holders it replaced for the undo and the replaced holder's check, a claim keeps a record).
OPEN: dict[str, tuple[str, ...]] = {}
#: DEDUP_JOBS_FATES="ok,lost" deals only those fates on every store (to tell a fate's
#: failures from the model's); "all" deals every fate on every store
_asked = os.environ.get("DEDUP_JOBS_FATES", "")
ASKED = list(FATES) if _asked == "all" else [f for f in _asked.split(",") if f]
assert set(ASKED) <= set(FATES), f"DEDUP_JOBS_FATES={ASKED}: each must be one of {FATES}"


def held_fates(store_name: str) -> tuple[str, ...]:
    """The fates dealt to ``store_name``'s calls (see OPEN)."""
    if ASKED:
        return tuple(ASKED)
    for prefix, held in OPEN.items():
        if store_name.startswith(prefix):
            return held
    return FATES


#: seconds spent waiting for deferred messages' turns (printed with the fates)
WAITED = [0.0]

picks = st.integers(min_value=0, max_value=31)
_dealt = ASKED or list(FATES)
fates = st.sampled_from(["ok", *_dealt] if len(_dealt) > 2 else _dealt)


@dataclass
class Body:
    tid: str
    kind: str
    nonce: str
    holds: bool  # the worker knows what its check granted (renewed, released at the end)
    ids: list[str] = field(default_factory=list)  # results this run writes (D: the burst's)


@dataclass
class Resend:
    """A call whose outcome the worker does not know: re-sent until the store answers."""

    what: str
    owner: str
    call: Callable[[], Any]
    apply: Callable[[Any], None]
