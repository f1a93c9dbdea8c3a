"""The Redis store on a Redis Cluster or Valkey cluster (S5): keys that spread, a cluster
client of the store's own.

Where keys live. A lock key gets a hash tag right after ``{task name}:`` (SPEC section 1):
``{KEY_PREFIX}:unique:{task name}:{<tag>}{id}``. The tag is one of :data:`GROUPS` short
numbers, chosen by a hash of the task name and readable id (:func:`group_of`). Every key a
script touches is the lock key plus a suffix (``:rel``, ``:run``, ``:seen``, ``:claimed``)
or the index shard of its group, ``{KEY_PREFIX}:index:unique:{<tag>}``, so they share one
slot, while different locks land in different groups. The tags are picked so that group
``g`` hashes into the ``g``-th of :data:`GROUPS` equal bands of the 16384 slots: however the
slots are split between primaries, each primary gets the groups of its share of the slots.
Debounce state, its id lists and its index follow the same rule; so does any later kind of
key built through :meth:`RedisClusterStore.place`.

The client. The store makes a ``valkey.cluster.ValkeyCluster`` of its own from the cache's
``LOCATION`` (every node URL given is a startup node), with ``socket_timeout`` and
``socket_connect_timeout`` at half the budget (STORE_TIMEOUT, or the cache's own
``SOCKET_TIMEOUT`` if shorter) and one retry of the client (after it re-reads the slot map):
a decision takes at most about the budget (S8), and a primary that is gone fails fast with a
refused connection (S6). ``MOVED`` and ``ASK`` are followed by the client. Each decision is
one ``EVALSHA`` routed by the slot of its keys; on ``NOSCRIPT`` (a new primary after a
failover or resharding, a restart, a flush) the script is sent once as ``EVAL`` to the same
slot, which loads it on that primary.
"""

from __future__ import annotations

import binascii
import logging
import re
import zlib
from typing import Any

from dedup_jobs.conf import app_settings
from dedup_jobs.exceptions import InvalidJobConfiguration, StoreUnavailable
from dedup_jobs.keys import JobKey, name_part
from dedup_jobs.stores.redis import scripts
from dedup_jobs.stores.redis.store import RedisStore

logger = logging.getLogger("dedup_jobs")

#: hash-tag groups: index shards, and the number of slots lock keys spread over
GROUPS = 128
SLOTS = 16384


def key_slot(tag: str) -> int:
    """The cluster slot of a hash tag's content (CRC16/XMODEM, as Redis computes it)."""
    return binascii.crc_hqx(tag.encode("utf-8"), 0) % SLOTS


def _tags() -> tuple[str, ...]:
    """For each group ``g``, the smallest number whose slot lies in band ``g``."""
    band = SLOTS // GROUPS
    found: dict[int, str] = {}
    n = 0
    while len(found) < GROUPS:
        found.setdefault(key_slot(str(n)) // band, str(n))
        n += 1
    return tuple(found[g] for g in range(GROUPS))


#: the hash tag (without braces) of each group
TAGS = _tags()
_TAG = re.compile(r":\{(\d{1,3})\}")
_KNOWN = frozenset(TAGS)


def group_of(key: JobKey) -> int:
    """The group of a lock, debounce or other key: by task name and readable id, so that a
    key and the keys made from it (a running marker, ``running_key``) share it."""
    return zlib.crc32(f"{key.task_name}\0{key.ident}".encode()) % GROUPS


def tagged(key: JobKey, group: int) -> str:
    """``key.key`` with the group's hash tag right after ``{task name}:`` (SPEC section 1)."""
    text = key.key
    marker = f":{name_part(key.task_name)}:"
    at = text.find(marker, len(app_settings.KEY_PREFIX))
    if at < 0:
        return f"{{{TAGS[group]}}}{text}"
    at += len(marker)
    return f"{text[:at]}{{{TAGS[group]}}}{text[at:]}"


def untagged(key: str) -> str:
    """A key read back from the cluster without its hash tag (the first one, one of ours)."""
    for match in _TAG.finditer(key):
        if match.group(1) in _KNOWN:
            return key[:match.start() + 1] + key[match.end():]
    return key


def startup_nodes(location: Any) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The ``(host, port)`` of every node URL in a cluster cache's LOCATION (a list, or a
    comma-separated string), and the connection options of the first (password, TLS)."""
    from valkey.connection import parse_url

    urls = location if isinstance(location, list | tuple) else str(location).split(",")
    nodes: list[tuple[str, int]] = []
    options: dict[str, Any] = {}
    for url in (str(u).strip() for u in urls if str(u).strip()):
        try:
            parsed = parse_url(url)
        except ValueError as exc:
            raise InvalidJobConfiguration(
                f"dedup_jobs: the cluster cache LOCATION entry {url!r} is not a node URL "
                f"({exc}); give a list like ['valkey://10.0.0.1:6379', ...].") from exc
        nodes.append((parsed.pop("host", "127.0.0.1"), int(parsed.pop("port", 6379))))
        parsed.pop("db", None)
        options = options or parsed
    if not nodes:
        raise InvalidJobConfiguration(
            f"dedup_jobs: the cluster cache LOCATION {location!r} names no node; give a list "
            f"of node URLs like ['valkey://10.0.0.1:6379', ...].")
    return nodes, options


class RedisClusterStore(RedisStore):
    """The Redis store on django-valkey's cluster cache (S5): the same scripts, keys with a
    hash tag per group, index shards per group, a cluster client of the store's own."""

    def __init__(self, alias: str) -> None:
        super().__init__(alias)
        self._check_key_function()

    # -- where keys live ------------------------------------------------------------------

    def place(self, key: JobKey, index: str = "unique") -> tuple[str, str]:
        group = group_of(key)
        return self.physical(tagged(key, group)), self.index_keys(index)[group]

    def index_keys(self, index: str = "unique") -> list[str]:
        found = self._indexes.get(index)
        if found is None:
            base = f"{app_settings.KEY_PREFIX}:index:{index}"
            found = self._indexes[index] = [self.physical(f"{base}:{{{tag}}}") for tag in TAGS]
        return found

    def logical(self, key: str) -> str:
        return untagged(key)

    def _check_key_function(self) -> None:
        """The cache's key function must keep a lock key and its index shard in one slot
        (Django's default, and any KEY_PREFIX, do; a KEY_FUNCTION that hashes or reorders the
        key may not): a clear error now rather than CROSSSLOT on every decision."""
        probe = JobKey(key=f"{app_settings.KEY_PREFIX}:unique:probe:1", task_name="probe",
                       ident="1")
        lock, index = self.place(probe)
        if _slot_of(lock) != _slot_of(index) or _slot_of(f"{lock}:rel") != _slot_of(lock):
            raise InvalidJobConfiguration(
                f"CACHES[{self.alias!r}]: its key function turns {tagged(probe, 0)!r} into "
                f"{lock!r} and the index key into {index!r}, which are not in one cluster "
                f"slot. Keep the hash tag: a KEY_FUNCTION must leave the key's braces as "
                f"they are (Django's default does), and KEY_PREFIX must not hold braces.")
        if _slot_of(lock) != key_slot(TAGS[group_of(probe)]):
            logger.warning(
                "CACHES[%r]: braces in its KEY_PREFIX (or key function) come before dedup_jobs' "
                "hash tag, so every lock, index and debounce state of this store is in one "
                "cluster slot, on one primary. Take the braces out of KEY_PREFIX to spread "
                "them over every primary.", self.alias)

    # -- the cluster client ---------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            from valkey.cluster import ClusterNode, ValkeyCluster

            own = self.adapter.socket_timeout(self.cache._params.get("OPTIONS") or {})
            self.budget = min(app_settings.STORE_TIMEOUT, float(own) if own else self.budget)
            nodes, extra = startup_nodes(self.cache._server)
            half = self.budget / 2
            try:
                self._client = ValkeyCluster(
                    startup_nodes=[ClusterNode(host, port)  # type: ignore[no-untyped-call]
                                   for host, port in nodes],
                    socket_timeout=half, socket_connect_timeout=half,
                    cluster_error_retry_attempts=1, retry=self._lib.no_retries(), **extra)
            except self._errors as exc:
                raise StoreUnavailable(self.alias, exc) from exc
            self._own_client = True
        return self._client

    def _send(self, name: str, keys: list[str], args: Any) -> Any:
        """One EVALSHA routed by the slot of ``keys``; on NOSCRIPT, one EVAL of the script
        to the same slot (which loads it on that primary)."""
        try:
            try:
                return self.client.execute_command(
                    "EVALSHA", self._sha[name], len(keys), *keys, *args)
            except self._no_script:
                return self.client.execute_command(
                    "EVAL", getattr(scripts, name), len(keys), *keys, *args)
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def _send_many(self, name: str, calls: list[tuple[list[str], tuple[Any, ...]]],
                   job: str = "?") -> list[Any]:
        """L3: a batch through the cluster client's pipeline, which writes each primary's
        share of the EVALSHAs at once and then reads the answers: one round trip per slot
        group's primary. A NOSCRIPT answer is sent again alone as EVAL (which loads it)."""
        try:
            pipe = self.client.pipeline()
            for keys, args in calls:
                pipe.execute_command("EVALSHA", self._sha[name], len(keys), *keys, *args)
            replies = list(pipe.execute(raise_on_error=False))
            for index, reply in enumerate(replies):
                if isinstance(reply, self._no_script):
                    keys, args = calls[index]
                    replies[index] = self.client.execute_command(
                        "EVAL", getattr(scripts, name), len(keys), *keys, *args)
                elif isinstance(reply, BaseException):
                    raise reply
            return replies
        except self._errors as exc:
            raise StoreUnavailable(self.alias, exc) from exc

    def close(self) -> None:
        self._closed = True
        if self._client is not None:
            self._client.close()


def _slot_of(key: str) -> int:
    """The slot of a key as Redis computes it (the first non-empty ``{...}``, else all)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    return key_slot(key)

