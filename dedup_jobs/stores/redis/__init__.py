"""The Redis store, in parts: ``scripts`` (every Lua script), ``connection`` (one round trip
per decision), ``store`` (the decisions), ``listing`` (reading and the admin's pages)."""

from dedup_jobs.stores.redis.connection import MAX_IDLE
from dedup_jobs.stores.redis.store import RedisStore

__all__ = ["MAX_IDLE", "RedisStore"]
