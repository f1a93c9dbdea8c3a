"""The bounded index trim, in Lua, that every script with an index shares.

An index (held locks, pending debounces, throttle keys) is a sorted set scored by when its
entry expires. Entries of keys that expired are dropped by the scripts that already run, at
most :data:`INDEX_TRIM` at a time: a backlog of keys that expired together (a million locks
whose jobs never ran) is cleared over the decisions that follow, never by one of them alone,
which would stall the server for the whole backlog (``benchmarks/growth.py``).
"""

#: the most expired index entries one script call drops
INDEX_TRIM = 100


def trim_lua(index: str, below: str, limit: int = INDEX_TRIM) -> str:
    """Lua: drop up to ``limit`` members of the sorted set ``index`` (a ``KEYS[n]`` or
    ``ARGV`` expression) scored below ``below`` (a Lua expression, ms); in a block of its own,
    so it can appear anywhere in a script; the count dropped is left in ``trimmed``."""
    return (
        f"local trimmed = 0\n"
        f"do\n"
        f"  local stale = redis.call('ZRANGEBYSCORE', {index}, '-inf', '(' .. ({below}), "
        f"'LIMIT', 0, {limit})\n"
        f"  if #stale > 0 then trimmed = redis.call('ZREM', {index}, unpack(stale)) end\n"
        f"end"
    )
