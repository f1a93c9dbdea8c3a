"""The fault helpers do what the fault tests rely on (S7's faults: late and lost replies)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tests.faults.proxy import Proxy
from tests.faults.servers import STALLS, RedisServer, redis_server


@pytest.mark.parametrize("kind", sorted(STALLS))
def test_a_stall_makes_replies_late_and_the_commands_still_run(
    private_redis: RedisServer, kind: str
) -> None:
    """S7 (fault model): during a stall the server answers nothing; a command sent on a
    connection made before it times out at the client, and runs once the stall is over."""
    client = private_redis.new_client(timeout=0.3)
    client.ping()
    stall = STALLS[kind](private_redis, 1.0)
    assert not private_redis.answers(0.1)
    with pytest.raises(redis.TimeoutError):
        _incr_once(client)
    stall.wait()
    assert stall.ended_at is not None and stall.ended_at - stall.started_at >= 1.0
    assert private_redis.client.get("ran") == b"1"


def _incr_once(client: redis.Redis) -> None:
    """One INCR, never retried by redis-py."""
    conn = client.connection_pool.get_connection()
    try:
        conn.send_command("INCR", "ran")
        conn.read_response()
    finally:
        conn.disconnect()
        client.connection_pool.release(conn)


def test_proxy_passes_delays_loses_and_swallows(
    store_proxy: Proxy, private_redis: RedisServer
) -> None:
    """S7 (fault model): the proxy passes replies, delays them, loses one after the server ran
    its command (the client sees a connection error), holds one back, or answers nothing."""
    client = redis.Redis(
        host=store_proxy.host, port=store_proxy.port, socket_timeout=1.0, retry=None
    )
    assert client.ping()
    store_proxy.delay_replies(0.3)
    started = time.monotonic()
    client.ping()
    assert time.monotonic() - started >= 0.3
    store_proxy.pass_through()
    lost = store_proxy.drop_next_reply(b"ctr")
    with pytest.raises(redis.ConnectionError):
        client.incr("ctr")
    assert lost.fired.is_set() and private_redis.client.get("ctr") == b"1"
    assert client.incr("ctr") == 2
    store_proxy.delay_next_reply(1.5, b"ctr")
    with pytest.raises(redis.TimeoutError):
        client.incr("ctr")
    assert client.incr("ctr") == 4
    store_proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        client.incr("ctr")
    store_proxy.pass_through()
    time.sleep(0.2)
    assert private_redis.client.get("ctr") == b"4"


def test_every_private_server_writes_into_a_directory_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica's full sync writes the primary's RDB into the server's ``dir``: with no
    ``--dir`` that was the test run's working directory (a dump.rdb got committed). Each
    private server gets a directory of its own, removed when it stops."""
    monkeypatch.chdir(tmp_path)  # the servers inherit the working directory
    with redis_server() as primary, \
            redis_server("--replicaof", primary.host, str(primary.port)) as replica:
        deadline = time.monotonic() + 20
        while replica.client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        dirs = [Path(s.client.config_get("dir")["dir"]) for s in (primary, replica)]
        assert len(set(dirs)) == 2 and tmp_path not in dirs, dirs
        assert (dirs[1] / "dump.rdb").exists(), list(dirs[1].iterdir())  # the full sync
    assert not [d for d in dirs if d.exists()], dirs
    assert list(tmp_path.iterdir()) == []
