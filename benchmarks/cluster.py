"""Redis Cluster throughput (S5): first-dispatch decisions of distinct keys, one node against a
3-primary cluster, on the same machine. Prints a table (not a timed test).

Starts its own servers on free loopback ports (stopped by pid at the end): one redis-server,
and a cluster of three redis-server primaries (no replicas) made with ``redis-cli --cluster
create``. For each target, PROCESSES processes (spawned, all released at once) take
DECISIONS locks of distinct ids each through the store (``RedisStore.acquire`` on
django-valkey's ValkeyCache for the node, ``RedisClusterStore.acquire`` on its
ClusterValkeyCache for the cluster: the same client library, valkey-py). Figures:

- client decisions/s: all decisions / wall time (bounded by the clients' CPU here: the
  machine's cores run the clients and the servers alike);
- store-side: from ``INFO commandstats`` of each primary, the EVALSHA calls it served and the
  microseconds it spent in them. Per-decision cost = usec / calls. A server runs scripts on
  one thread, so a primary can serve at most calls / (usec / 1e6) decisions per second
  of its own; the cluster's capacity is bounded by its busiest primary: all decisions /
  busiest primary's seconds.

Run:
    uv run python benchmarks/cluster.py [--processes 8] [--decisions 3000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKEND_NODE = "django_valkey.cache.ValkeyCache"


def _setup(caches: dict[str, Any], alias: str) -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "dedup_jobs"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                    **caches},
            DEDUP_JOBS={"STORE": alias}, USE_TZ=True)
        django.setup()


def _dispatcher(caches: dict[str, Any], alias: str, worker: int, decisions: int,
                barrier: Any, out: Any) -> None:
    _setup(caches, alias)
    from dedup_jobs import clock
    from dedup_jobs.keys import build_key
    from dedup_jobs.stores import get_store

    store: Any = get_store(alias)
    keys = [build_key("unique", "bench.cluster", f"w{worker}-{n}") for n in range(decisions)]
    store.acquire(build_key("unique", "bench.warm", str(worker)), "w", 1, now=clock.now())
    barrier.wait()  # warm: the parent resets the statistics
    barrier.wait()  # go
    taken = sum(store.acquire(key, f"o{worker}", 600, now=clock.now()).acquired
                for key in keys)
    out.put(taken)


def _evalsha(client: Any) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def measure(label: str, caches: dict[str, Any], alias: str, primaries: list[Any],
            processes: int, decisions: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes + 1, timeout=120)
    out = ctx.Queue()
    procs = [ctx.Process(target=_dispatcher,
                         args=(caches, alias, n, decisions, barrier, out), daemon=True)
             for n in range(processes)]
    for proc in procs:
        proc.start()
    for server in primaries:
        server.client.flushall()
    barrier.wait()  # every process is up, its scripts loaded
    for server in primaries:
        server.client.config_resetstat()
    barrier.wait()
    started = time.perf_counter()
    taken = sum(out.get(timeout=600) for _ in procs)
    wall = time.perf_counter() - started
    for proc in procs:
        proc.join(timeout=30)
    per_node = [(server.port, *_evalsha(server.client)) for server in primaries]
    calls = sum(c for _, c, _ in per_node)
    usec = sum(u for _, _, u in per_node)
    busiest = max(u for _, _, u in per_node) / 1e6
    return {"label": label, "taken": taken, "wall": wall, "calls": calls, "usec": usec,
            "busiest": busiest, "per_node": per_node}


def control(alias: str, primaries: list[Any], count: int) -> float:
    """Server usec per ACQUIRE when the calls come pipelined from one client, one primary
    at a time (each server busy, not woken per call, and not sharing the cores with the
    other primaries): the script's own cost on that target, on the keys the store builds
    (``place``), each sent straight to the primary that serves its slot."""
    from dedup_jobs import clock
    from dedup_jobs.keys import build_key
    from dedup_jobs.stores import get_store
    from dedup_jobs.stores.redis import scripts
    from dedup_jobs.stores.redis.cluster import TAGS, RedisClusterStore, group_of, key_slot

    store: Any = get_store(alias)
    deadline = int((clock.now() + 600) * 1000)
    by_port: dict[int, list[Any]] = {server.port: [] for server in primaries}
    owners = _slot_owners(primaries)
    for n in range(count):
        key = build_key("unique", "bench.control", f"c-{n}")
        lock, index = store.place(key)
        port = (owners[key_slot(TAGS[group_of(key)])] if isinstance(store, RedisClusterStore)
                else primaries[0].port)
        by_port[port].append((lock, index, key))
    calls = usec = 0
    for server in primaries:
        client = server.client
        client.script_load(scripts.ACQUIRE)
        client.config_resetstat()
        pipe = client.pipeline(transaction=False)
        for lock, index, key in by_port[server.port]:
            pipe.evalsha(scripts.SHA["ACQUIRE"], 2, lock, index, "o", 600_000, deadline, "0",
                         key.task_name, key.ident)
        pipe.execute()
        found_calls, found_usec = _evalsha(client)
        calls, usec = calls + found_calls, usec + found_usec
    return usec / max(calls, 1)


def _slot_owners(primaries: list[Any]) -> dict[int, int]:
    """slot -> port of the primary serving it (CLUSTER SLOTS; all on one for a plain node)."""
    try:
        slots = primaries[0].client.execute_command("CLUSTER", "SLOTS")
    except Exception:  # a plain node: not a cluster
        return {}
    owners = {}
    for lo, hi, primary, *_replicas in slots:
        for slot in range(int(lo), int(hi) + 1):
            owners[slot] = int(primary[1])
    return owners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--decisions", type=int, default=3000, help="per process")
    args = parser.parse_args()
    from tests.cluster.servers import cluster
    from tests.faults.servers import redis_server, redis_server_binary

    binary = redis_server_binary()
    rows = []
    with ExitStack() as stack:
        node = stack.enter_context(redis_server(binary=binary))
        found = stack.enter_context(cluster(binary, kind="redis", replicas=0))
        single = {"node": {"BACKEND": BACKEND_NODE, "LOCATION": f"valkey://{node.host}:"
                           f"{node.port}/0"}}
        rows.append(measure("1 node", single, "node", [node], args.processes,
                            args.decisions))
        rows.append(measure("3-primary cluster", {"cluster": found.cache()}, "cluster",
                            found.primaries(), args.processes, args.decisions))
        version = node.client.info("server")["redis_version"]
        _setup({**single, "cluster": found.cache()}, "node")
        controls = {"1 node": control("node", [node], 8000),
                    "3-primary cluster": control("cluster", found.primaries(), 8000)}
    total = args.processes * args.decisions
    print(f"\nfirst-dispatch decisions of distinct keys: {args.processes} processes x "
          f"{args.decisions}, redis-server {version}, {os.cpu_count()} cores, valkey-py "
          f"client on both\n")
    head = ["target", "decisions", "taken", "wall s", "client dec/s", "EVALSHA calls",
            "server usec", "usec/decision", "busiest primary s", "store-side dec/s"]
    lines = [head]
    for r in rows:
        lines.append([r["label"], total, r["taken"], f"{r['wall']:.2f}",
                      f"{total / r['wall']:.0f}", r["calls"], r["usec"],
                      f"{r['usec'] / max(r['calls'], 1):.2f}", f"{r['busiest']:.3f}",
                      f"{r['calls'] / r['busiest']:.0f}"])
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(str(cell).rjust(width) for cell, width in zip(line, widths, strict=True)))
    print("\nstore-side dec/s = EVALSHA calls / busiest primary s (the server's own time "
          "in the scripts; one thread per primary)")
    cluster_row = rows[1]
    print("\nsplit across the cluster's primaries (INFO commandstats of each):")
    for port, calls, usec in cluster_row["per_node"]:
        share = calls / max(cluster_row["calls"], 1)
        print(f"  primary :{port}  EVALSHA calls {calls}  ({share:.1%})  usec {usec}  "
              f"usec/call {usec / max(calls, 1):.2f}")
    single_row = rows[0]
    rate_c = cluster_row["calls"] / cluster_row["busiest"]
    rate_n = single_row["calls"] / single_row["busiest"]
    cost_c = cluster_row["usec"] / cluster_row["calls"]
    cost_n = single_row["usec"] / single_row["calls"]
    print(f"\nratios: store-side dec/s cluster / node = {rate_c:.0f} / {rate_n:.0f} = "
          f"{rate_c / rate_n:.2f}; usec/decision cluster / node = {cost_c:.2f} / "
          f"{cost_n:.2f} = {cost_c / cost_n:.2f}")
    print("\ncontrol, 8,000 ACQUIREs pipelined from one client, one primary at a time: "
          "server usec/decision " + ", ".join(
              f"{label} {value:.2f}" for label, value in controls.items())
          + f"; cluster / node = {controls['3-primary cluster'] / controls['1 node']:.2f}")


if __name__ == "__main__":
    main()
