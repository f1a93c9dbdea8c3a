"""S6 on a real cluster: slots moved while dispatches run, and a primary killed (matrix: each
test starts a cluster of its own and runs for seconds)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.keys import JobKey, build_key
from dedup_jobs.stores import get_store
from dedup_jobs.stores.redis.cluster import TAGS, group_of, key_slot
from tests.cluster.servers import Cluster, cluster, redis_cli_binary
from tests.faults.servers import HOST, redis_server_binary, valkey_server_binary

pytestmark = pytest.mark.matrix
TASK = "tests.unique_sleep"


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A cluster for this test alone (it is resharded or loses a primary); a short
    cluster-node-timeout so that a failover takes about two seconds. Parametrised
    indirectly: ``(kind, cluster-require-full-coverage)``, kind "redis" (Redis 7) or
    "valkey" (Valkey 8), coverage "yes" (the server's default) or "no"."""
    kind, coverage = getattr(request, "param", ("redis", "yes"))
    extra = ("--cluster-require-full-coverage", coverage)
    binary = valkey_server_binary() if kind == "valkey" else redis_server_binary()
    with cluster(binary, kind=kind, node_timeout_ms=1000,
                 extra=extra) as found, override_settings(
            CACHES={**settings.CACHES, "cluster": found.cache()},
            DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "cluster", "STORE_TIMEOUT": 1.0}):
        yield found


def keys_on(found: Cluster, server: Any, count: int, start: int = 0) -> list[JobKey]:
    """``count`` lock keys whose slot ``server`` serves now."""
    slots = {slot for node in found.nodes() if node["port"] == server.port
             for lo, hi in node["slots"] for slot in range(lo, hi + 1)}
    found_keys: list[JobKey] = []
    n = start
    while len(found_keys) < count:
        key = build_key("unique", TASK, f"item={n}")
        if key_slot(TAGS[group_of(key)]) in slots:
            found_keys.append(key)
        n += 1
    return found_keys


@dataclass
class Log:
    """What each decision cycle of a driver saw: (monotonic start, seconds taken, outcome)."""

    entries: list[tuple[float, float, str]] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    #: owner -> when its release was acknowledged (monotonic)
    released: dict[str, float] = field(default_factory=dict)
    #: (holder, when its release was acknowledged): a take refused by a lock whose release
    #: the store had acknowledged; after a failover, a release the replica never received
    #: (asynchronous replication) brings its lock back until it expires
    resurrected: list[tuple[str, float]] = field(default_factory=list)


def cycle(store: Any, key: JobKey, n: int, log: Log, leftover: list[tuple[JobKey, str]]) -> None:
    """One lock's life, every answer checked: take, refused to another, start, release. A
    cycle cut short by StoreUnavailable leaves its lock in ``leftover``, released (compare-
    and-delete) before the next cycle of the thread runs."""
    started = time.monotonic()
    mine, other = f"a-{n}", f"b-{n}"
    try:
        while leftover:
            left_key, left_owner = leftover[-1]
            store.release(left_key, left_owner)
            leftover.pop()
        leftover.append((key, mine))
        taken = store.acquire(key, mine, 30, now=clock.now())
        refused = store.acquire(key, other, 30, now=clock.now())
        started_run = store.start(key, mine, 30, now=clock.now(), release=False)
        released = store.release(key, mine)
        leftover.pop()
        if released:
            log.released[mine] = time.monotonic()
        if not taken.acquired and taken.holder in log.released:
            log.resurrected.append((taken.holder, log.released[taken.holder]))
        elif not (taken.acquired and not refused.acquired and refused.holder == mine
                and started_run.run and released):
            log.wrong.append(f"{key.ident}: {taken} {refused} {started_run} {released}")
        outcome = "ok"
    except StoreUnavailable as exc:
        outcome = f"unavailable: {exc}"
    log.entries.append((started, time.monotonic() - started, outcome))


def drive(keys: list[JobKey], stop: threading.Event, log: Log) -> threading.Thread:
    store = get_store("cluster")

    def run() -> None:
        n = 0
        leftover: list[tuple[JobKey, str]] = []
        while not stop.is_set():
            cycle(store, keys[n % len(keys)], n, log, leftover)
            n += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("own_cluster", [("redis", "yes"), ("valkey", "yes")], indirect=True,
                         ids=["redis-cluster", "valkey-cluster"])
def test_slots_move_while_dispatches_run(own_cluster: Cluster) -> None:
    """S6/S5: ``redis-cli --cluster reshard`` moves 2,000 slots (about 15 hash-tag groups
    of keys) from one primary to another while four threads run lock cycles on keys of the
    moving slots: no decision is answered wrongly (MOVED and ASK are followed by the
    client), the moved keys' decisions work on their new primary, and the window is printed."""
    source, target = own_cluster.primaries()[:2]
    nodes = {n["port"]: n["id"] for n in own_cluster.nodes()}
    get_store("cluster").acquire(build_key("unique", TASK, "warm"), "w", 5, now=clock.now())
    lo = min(lo for n in own_cluster.nodes() if n["port"] == source.port for lo, _ in n["slots"])
    moving = [k for k in keys_on(own_cluster, source, 400)
              if key_slot(TAGS[group_of(k)]) < lo + 2000][:40]
    assert len(moving) >= 8
    log, stop = Log(), threading.Event()
    threads = [drive(moving[i::4], stop, log) for i in range(4)]
    time.sleep(0.5)
    moved_at = time.monotonic()
    done = subprocess.run(
        [redis_cli_binary(), "--cluster", "reshard", f"{HOST}:{source.port}",
         "--cluster-from", nodes[source.port], "--cluster-to", nodes[target.port],
         "--cluster-slots", "2000", "--cluster-yes", "--cluster-pipeline", "10"],
        capture_output=True, text=True, timeout=300, check=False)
    took = time.monotonic() - moved_at
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    own_cluster.wait_ok()
    during = [e for e in log.entries if moved_at <= e[0] <= moved_at + took]
    failed = [e for e in log.entries if e[2] != "ok"]
    moved_keys = [k for k in moving if own_cluster.owner_of(key_slot(TAGS[group_of(k)]))
                  .port == target.port]
    print(f"\nS6 {own_cluster.kind} cluster reshard: 2000 slots {source.port} -> "
          f"{target.port} in {took:.1f} s; "
          f"{len(log.entries)} lock cycles (4 decisions each), {len(during)} during the "
          f"move, {len(failed)} StoreUnavailable, {len(log.wrong)} wrong answers; slowest "
          f"cycle {max(e[1] for e in log.entries):.2f} s; {len(moved_keys)} of "
          f"{len(moving)} driven keys now on the target")
    assert log.wrong == [] and log.resurrected == []
    assert len(during) > 0 and moved_keys == moving
    assert [e for e in failed if e[0] > moved_at + took] == []
    store = get_store("cluster")
    for n, key in enumerate(moved_keys):
        log_after = Log()
        cycle(store, key, 10_000 + n, log_after, [])
        assert log_after.entries[0][2] == "ok" and log_after.wrong == []


@pytest.mark.parametrize(
    "own_cluster", [("redis", "no"), ("redis", "yes"), ("valkey", "no")], indirect=True,
    ids=["redis-full-coverage-no", "redis-full-coverage-yes", "valkey-full-coverage-no"])
def test_a_killed_primary_fails_fast_then_its_replica_takes_over(
    own_cluster: Cluster, request: pytest.FixtureRequest,
) -> None:
    """S6: SIGKILL one primary while threads run lock cycles on its keys and on the other
    primaries' keys: decisions on its slots are StoreUnavailable, each within STORE_TIMEOUT
    (1 s here), until its replica is promoted, then work again without a restart. With
    ``cluster-require-full-coverage no`` the other primaries' decisions never fail; with the
    server's default ``yes`` every node refuses queries (CLUSTERDOWN) from the moment the
    primary is marked failed until the promotion: those fail fast too, and only with
    ClusterDownError. Prints both windows and how many locks acknowledged just before the
    kill the promoted replica lost (asynchronous replication), and how many releases: a
    release acknowledged just before the kill can be lost too, and its lock, back on the
    promoted replica, refuses takes of its key until it expires (a refusal naming an owner
    released after the kill, or on another primary, is still a wrong answer)."""
    kind, coverage = request.node.callspec.params["own_cluster"]
    victim, *others = own_cluster.primaries()
    replica = own_cluster.replica_of(victim)
    store = get_store("cluster")
    before = keys_on(own_cluster, victim, 200, start=50_000)
    for n, key in enumerate(before):
        assert store.acquire(key, f"held-{n}", 600, now=clock.now()).acquired
    victim_keys = keys_on(own_cluster, victim, 20)
    other_keys = [k for server in others for k in keys_on(own_cluster, server, 10)]
    victim_log, other_log, stop = Log(), Log(), threading.Event()
    threads = [drive(victim_keys[i::2], stop, victim_log) for i in range(2)]
    threads += [drive(other_keys[i::2], stop, other_log) for i in range(2)]
    time.sleep(0.5)
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    victim.process.wait(timeout=5)
    deadline = killed_at + 30
    while time.monotonic() < deadline:
        after = [e for e in victim_log.entries if e[0] > killed_at]
        if any(e[2] != "ok" for e in after) and after[-1][2] == "ok":
            break
        time.sleep(0.1)
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    after = [e for e in victim_log.entries if e[0] > killed_at]
    failed = [e for e in after if e[2] != "ok"]
    back = next((e for e in after if e[2] == "ok" and e[0] > failed[-1][0]), None) if failed \
        else None
    assert failed, "no decision on the killed primary's slots failed"
    assert back is not None, "decisions on the killed primary's slots never worked again"
    window = back[0] - killed_at
    slowest = max(e[1] for e in failed)
    promoted = replica.client.info("replication")["role"]
    survived = sum(1 for key in before if store.get(key) is not None)
    others_after = [e for e in other_log.entries if e[0] > killed_at]
    others_failed = [e for e in others_after if e[2] != "ok"]
    others_window = (max(e[0] + e[1] for e in others_failed) - min(e[0] for e in others_failed)
                     if others_failed else 0.0)
    print(f"\nS6 {kind} cluster failover (cluster-require-full-coverage {coverage}): primary "
          f"{victim.port} killed, replica {replica.port} now "
          f"{promoted}; its slots: {len(failed)} lock cycles StoreUnavailable, slowest "
          f"{slowest:.2f} s, window kill -> first cycle answered again {window:.2f} s; other "
          f"primaries: {len(others_after)} cycles after the kill, "
          f"{len(others_failed)} failed over {others_window:.2f} s, slowest "
          f"{max(e[1] for e in others_after):.2f} s; locks acknowledged before the kill and "
          f"lost with it {len(before) - survived} of {len(before)}; releases acknowledged "
          f"before the kill and lost with it {len({h for h, _ in victim_log.resurrected})} "
          f"(their locks refused {len(victim_log.resurrected)} takes until they expire); "
          f"wrong answers {len(victim_log.wrong) + len(other_log.wrong)}")
    assert promoted == "master"
    assert victim_log.wrong == [] and other_log.wrong == []
    # only a release acknowledged before the kill can come back, only on the victim's slots
    assert all(at < killed_at for _holder, at in victim_log.resurrected), (
        victim_log.resurrected, killed_at)
    assert other_log.resurrected == []
    # a failed cycle ends at its first StoreUnavailable: within STORE_TIMEOUT (1 s)
    assert all(e[1] <= 1.0 + 0.5 for e in failed), slowest
    if coverage == "no":
        assert others_failed == []
    else:
        assert all("ClusterDownError" in e[2] for e in others_failed), others_failed[:3]
    assert all(e[1] <= 1.0 + 0.5 for e in others_after)


def test_a_stopped_primary_fails_within_store_timeout(own_cluster: Cluster) -> None:
    """S8/S6 on S5: a primary that stops answering without refusing connections (SIGSTOP: the
    kernel still accepts and buffers) makes a decision on its slots StoreUnavailable within
    STORE_TIMEOUT (1 s here; the store's cluster client waits half of it per try, tries
    twice); a decision on another primary's slot answers meanwhile."""
    victim, other = own_cluster.primaries()[:2]
    store = get_store("cluster")
    stuck, free = keys_on(own_cluster, victim, 1)[0], keys_on(own_cluster, other, 1)[0]
    assert store.acquire(stuck, "warm", 1, now=clock.now()).acquired  # connections made
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.acquire(stuck, "a", 30, now=clock.now())
        took = time.monotonic() - started
        answered = time.monotonic()
        assert store.acquire(free, "b", 30, now=clock.now()).acquired
        other_took = time.monotonic() - answered
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    print(f"\nS8 cluster: a decision on a stopped primary's slot failed after {took:.2f} s "
          f"(STORE_TIMEOUT 1 s); one on another primary answered in {other_took:.3f} s")
    assert took <= 1.0 + 0.3
