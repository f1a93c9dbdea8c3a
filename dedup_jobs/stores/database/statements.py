"""Every one-statement decision of the database store, in each database's own syntax.

Forms ("dialects"), by what the database has:

- ``on_conflict``: PostgreSQL and SQLite (3.35+), ``INSERT … ON CONFLICT … DO UPDATE …
  RETURNING`` and ``UPDATE … RETURNING``: one statement per decision.
- ``duplicate_key``: MariaDB (10.5+), ``INSERT … ON DUPLICATE KEY UPDATE … RETURNING``: one
  statement per decision, but the claim of a burst (no ``UPDATE … RETURNING`` to move the
  row to its claim record: it locks the row, ``SELECT … FOR UPDATE``, and moves it).
- ``duplicate_key_read``: MySQL 8 (no ``RETURNING``), the same ``INSERT … ON DUPLICATE KEY
  UPDATE`` and then a ``SELECT`` of the row in one transaction: the upsert decides, and keeps
  the row locked until the read has it. A claim locks the row and moves it, as on MariaDB.
- None (older SQLite and MariaDB, other databases): the row-locking path of
  :mod:`dedup_jobs.stores.database.portable`.

Times: ``{now}`` and ``{until}`` are the database server's clock (and its now + the lock's ttl),
from :mod:`dedup_jobs.stores.database.servertime`, so expiry is the server's everywhere.

MySQL/MariaDB evaluate the assignments of ``ON DUPLICATE KEY UPDATE`` left to right, a later
one seeing the columns earlier ones set (unless ``SIMULTANEOUS_ASSIGNMENT`` is on, where all
see the old row). Each statement below orders its assignments so that both readings give the
same row: a condition is read only from columns not yet assigned, or from columns whose new
value keeps it true (the owner once it is the caller's, the nonce once it is the caller's).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

# -- locks ----------------------------------------------------------------------------------

LOCK_COLUMNS = '({k}, task_name, ident, owner, state, acquired_at, expires_at, nonce, chain)'
LOCK_VALUES = "VALUES (%s, %s, %s, %s, %s, {now}, {until}, %s, '')"

# The acquire / worker start upsert: insert, or overwrite the row when it is free (expired) or,
# for a re-entrant acquire / worker start, already ours ({cond}). The per-call nonce tells the
# A row taken free starts with no take-over chain (R1, S7: ``chain``, kept by a re-entrant acquire
# and a worker start, as the Redis scripts keep theirs). The per-call nonce tells the
# outcomes apart: returned as sent → taken now (row was free); "held-" + nonce → it was already
# ours ({keep}); anything else → another owner holds it, or (worker start, our owner in the row)
# another delivery of the same message runs it: the row's nonce is that delivery's (W5, LIVE).
UPSERT = {
    "on_conflict": """
INSERT INTO {t} {columns} {values}
ON CONFLICT ({k}) DO UPDATE SET
  owner = CASE WHEN {cond} THEN EXCLUDED.owner ELSE {t}.owner END,
  state = CASE WHEN {cond} THEN EXCLUDED.state ELSE {t}.state END,
  task_name = CASE WHEN {cond} THEN EXCLUDED.task_name ELSE {t}.task_name END,
  ident = CASE WHEN {cond} THEN EXCLUDED.ident ELSE {t}.ident END,
  acquired_at = CASE WHEN {keep} THEN {t}.acquired_at
                     WHEN {cond} THEN EXCLUDED.acquired_at ELSE {t}.acquired_at END,
  expires_at = CASE WHEN {cond} THEN EXCLUDED.expires_at ELSE {t}.expires_at END,
  chain = CASE WHEN {free} THEN EXCLUDED.chain ELSE {t}.chain END,
  nonce = CASE WHEN {keep} AND {t}.nonce = EXCLUDED.nonce THEN {t}.nonce
               WHEN {keep} THEN 'held-' || EXCLUDED.nonce
               WHEN {cond} THEN EXCLUDED.nonce ELSE {t}.nonce END
""",
    # acquired_at, then nonce (both read the old row), then owner, task_name, ident, state
    # (read {cond} with the nonce already the caller's: LIVE false), expires_at last (FREE
    # reads it).
    "duplicate_key": """
INSERT INTO {t} {columns} {values}
ON DUPLICATE KEY UPDATE
  acquired_at = CASE WHEN {keep} THEN {t}.acquired_at
                     WHEN {cond} THEN VALUES(acquired_at) ELSE {t}.acquired_at END,
  nonce = CASE WHEN {keep} AND {t}.nonce = VALUES(nonce) THEN {t}.nonce
               WHEN {keep} THEN CONCAT('held-', VALUES(nonce))
               WHEN {cond} THEN VALUES(nonce) ELSE {t}.nonce END,
  owner = CASE WHEN {cond} THEN VALUES(owner) ELSE {t}.owner END,
  task_name = CASE WHEN {cond} THEN VALUES(task_name) ELSE {t}.task_name END,
  ident = CASE WHEN {cond} THEN VALUES(ident) ELSE {t}.ident END,
  state = CASE WHEN {cond} THEN VALUES(state) ELSE {t}.state END,
  chain = CASE WHEN {free} THEN VALUES(chain) ELSE {t}.chain END,
  expires_at = CASE WHEN {cond} THEN VALUES(expires_at) ELSE {t}.expires_at END
""",
}
FREE = {
    "on_conflict": "{t}.expires_at <= EXCLUDED.acquired_at",
    "duplicate_key": "{t}.expires_at <= VALUES(acquired_at)",
}
MINE = {
    "on_conflict": "({t}.owner = EXCLUDED.owner AND NOT {t}.expires_at <= EXCLUDED.acquired_at)",
    "duplicate_key": "({t}.owner = VALUES(owner) AND NOT {t}.expires_at <= VALUES(acquired_at))",
}
LIVE = {
    "on_conflict": (
        "({t}.state = 'running' AND {t}.nonce <> EXCLUDED.nonce"
        " AND {t}.nonce <> 'held-' || EXCLUDED.nonce)"
    ),
    "duplicate_key": (
        "({t}.state = 'running' AND {t}.nonce <> VALUES(nonce)"
        " AND {t}.nonce <> CONCAT('held-', VALUES(nonce)))"
    ),
}

# The caller's own held lock: extend it, never shorten it (a held row only). Parameters: the
# {until} ones twice, key, owner, the {now} ones.
EXTEND = """
UPDATE {t} SET expires_at = CASE WHEN expires_at < {until} THEN {until} ELSE expires_at END
WHERE {k} = %s AND owner = %s AND expires_at > {now}
"""
#: the lease's usual renewal: EXTEND of a row nobody asked to stop (L2: a row with a request,
#: even a stale one, is renewed on the slower path that reads it, and a stale one cleared)
EXTEND_UNASKED = EXTEND + "AND cancel IS NULL\n"
EXTEND_CLEARED = EXTEND.replace("SET ", "SET cancel = NULL, ", 1)

# The lease taking a free key back (W6): insert, or overwrite an expired row; a row still held
# is left as it is. The nonce is the running delivery's, as the worker start leaves it
# ("held-" + nonce: the same delivery), so W5 still knows the run. ON CONFLICT returns no row
# when it left a held row alone; ON DUPLICATE KEY always returns the row (owner, nonce). Its
# ``{values}`` carry the renewal's deadline (``in_time``, S7): a late take-back inserts and
# updates nothing, and returns no row (the lease's run may have ended and released).
TAKE_FREE = {
    "on_conflict": """
INSERT INTO {t} {columns} {values}
ON CONFLICT ({k}) DO UPDATE SET
  owner = EXCLUDED.owner, state = EXCLUDED.state, task_name = EXCLUDED.task_name,
  ident = EXCLUDED.ident, acquired_at = EXCLUDED.acquired_at,
  expires_at = EXCLUDED.expires_at, nonce = EXCLUDED.nonce, chain = EXCLUDED.chain
WHERE {t}.expires_at <= EXCLUDED.acquired_at
""",
    "duplicate_key": """
INSERT INTO {t} {columns} {values}
ON DUPLICATE KEY UPDATE
  owner = CASE WHEN {free} THEN VALUES(owner) ELSE {t}.owner END,
  state = CASE WHEN {free} THEN VALUES(state) ELSE {t}.state END,
  task_name = CASE WHEN {free} THEN VALUES(task_name) ELSE {t}.task_name END,
  ident = CASE WHEN {free} THEN VALUES(ident) ELSE {t}.ident END,
  acquired_at = CASE WHEN {free} THEN VALUES(acquired_at) ELSE {t}.acquired_at END,
  nonce = CASE WHEN {free} THEN VALUES(nonce) ELSE {t}.nonce END,
  chain = CASE WHEN {free} THEN VALUES(chain) ELSE {t}.chain END,
  expires_at = CASE WHEN {free} THEN VALUES(expires_at) ELSE {t}.expires_at END
""",
}

# Release (U4, S7): compare-and-"delete" that leaves the row expired as a tombstone of its owner
# ("released" in the nonce), so that the release made again after a lost reply answers True
# (its row is matched again, unchanged) for {ago} = the tombstone's life; a new acquire takes
# the expired row as any free one. Parameters: the {now} ones, key, owner, the {now} ones, the
# {ago} ones. (MySQL/MariaDB: expires_at is assigned first, reading the old nonce.)
RELEASE = """
UPDATE {t} SET expires_at = CASE WHEN nonce = 'released' THEN expires_at ELSE {now} END,
  nonce = 'released'
WHERE {k} = %s AND owner = %s
  AND (expires_at > {now} OR (nonce = 'released' AND expires_at > {ago}))
"""

# -- debounce -------------------------------------------------------------------------------

DEBOUNCE_COLUMNS = (
    "({k}, task_name, ident, message_id, latest_id, superseded_id, payload, count,"
    " first_dispatch_at, last_dispatch_at, run_at, deadline, runs_at, expires_at, absorbed,"
    " previous_payload)"
)
DEBOUNCE_VALUES = "VALUES (%s, %s, %s, %s, %s, '', %s, 1, %s, %s, %s, %s, %s, {until}, %s, '')"

# One dispatch. A row that expired (by the server's clock), or whose burst was due more than
# the grace before the dispatch (D9, by the dispatcher's clock: the one parameter of {stale}),
# is a burst whose message is taken as lost: start over, adopting its ids (the new run answers
# them). Returns the burst's message id and the dispatch it superseded ("" when it started a
# burst). The burst's own times (first/last dispatch, runs at, deadline) are the dispatcher's,
# as the countdown of its message is.
DEBOUNCE_UPSERT = {
    "on_conflict": """
INSERT INTO {t} {columns} {values}
ON CONFLICT ({k}) DO UPDATE SET
  message_id = CASE WHEN {stale} THEN EXCLUDED.message_id ELSE {t}.message_id END,
  superseded_id = CASE WHEN {stale} THEN '' ELSE {t}.latest_id END,
  latest_id = EXCLUDED.latest_id,
  previous_payload = CASE WHEN {stale} THEN '' ELSE {t}.payload END,
  payload = EXCLUDED.payload,
  count = CASE WHEN {stale} THEN 1 ELSE {t}.count + 1 END,
  task_name = EXCLUDED.task_name,
  ident = EXCLUDED.ident,
  first_dispatch_at = CASE WHEN {stale} THEN EXCLUDED.first_dispatch_at
                           ELSE {t}.first_dispatch_at END,
  last_dispatch_at = EXCLUDED.last_dispatch_at,
  run_at = EXCLUDED.run_at,
  deadline = CASE WHEN {stale} THEN EXCLUDED.deadline ELSE {t}.deadline END,
  runs_at = CASE WHEN {stale} THEN EXCLUDED.runs_at
                 WHEN {t}.deadline IS NOT NULL AND {t}.deadline < EXCLUDED.run_at
                 THEN {t}.deadline ELSE EXCLUDED.run_at END,
  expires_at = EXCLUDED.expires_at,
  absorbed = {t}.absorbed || ',' || EXCLUDED.absorbed
""",
    # Each assignment sees the ones before it: superseded_id before latest_id, deadline
    # before runs_at (unchanged unless {stale}), runs_at and expires_at ({stale}) after every
    # test of {stale}; past runs_at, "count = 1" is the test (a burst that started over).
    "duplicate_key": """
INSERT INTO {t} {columns} {values}
ON DUPLICATE KEY UPDATE
  message_id = CASE WHEN {stale} THEN VALUES(message_id) ELSE {t}.message_id END,
  superseded_id = CASE WHEN {stale} THEN '' ELSE {t}.latest_id END,
  count = CASE WHEN {stale} THEN 1 ELSE {t}.count + 1 END,
  first_dispatch_at = CASE WHEN {stale} THEN VALUES(first_dispatch_at)
                           ELSE {t}.first_dispatch_at END,
  deadline = CASE WHEN {stale} THEN VALUES(deadline) ELSE {t}.deadline END,
  runs_at = CASE WHEN {stale} THEN VALUES(runs_at)
                 WHEN {t}.deadline IS NOT NULL AND {t}.deadline < VALUES(run_at)
                 THEN {t}.deadline ELSE VALUES(run_at) END,
  absorbed = CONCAT({t}.absorbed, ',', VALUES(absorbed)),
  latest_id = VALUES(latest_id),
  previous_payload = CASE WHEN {t}.count = 1 THEN '' ELSE {t}.payload END,
  payload = VALUES(payload),
  task_name = VALUES(task_name),
  ident = VALUES(ident),
  last_dispatch_at = VALUES(last_dispatch_at),
  run_at = VALUES(run_at),
  expires_at = VALUES(expires_at)
""",
}
STALE = "({t}.expires_at <= {now} OR {t}.runs_at < %s)"

# S7: the dispatch is in the burst already (made again after a lost reply): the row stays as it
# is, and its answer is read from the ids it returns (``absorbed``).
RESENT = {
    "on_conflict": "(replace(',' || {t}.absorbed || ',', ',' || EXCLUDED.latest_id || ',', '')"
                   " <> ',' || {t}.absorbed || ',')",
    "duplicate_key": "(REPLACE(CONCAT(',', {t}.absorbed, ','), CONCAT(',', VALUES(latest_id),"
                     " ','), '') <> CONCAT(',', {t}.absorbed, ','))",
}


def _unless_resent(upsert: str, form: str) -> str:
    """``upsert`` with each assignment kept as the row has it when the dispatch is in the
    burst already (RESENT); on MySQL/MariaDB ``absorbed``, which RESENT reads, is assigned
    last (the assignments see the ones before them)."""
    head, marker, body = upsert.partition("UPDATE SET\n" if form == "on_conflict"
                                          else "UPDATE\n")
    chunks: list[list[str]] = []
    for line in body.strip("\n").split("\n"):
        if line.startswith("  ") and not line.startswith("   "):
            chunks.append([line.strip()])
        else:
            chunks[-1].append(line.strip())
    assignments = []
    for chunk in chunks:
        column, _, expr = " ".join(chunk).rstrip(",").partition(" = ")
        assignments.append((column, expr))
    assignments.sort(key=lambda item: item[0] == "absorbed")
    resent = RESENT[form]
    return head + marker + ",\n".join(
        f"  {column} = CASE WHEN {resent} THEN {{t}}.{column} ELSE {expr} END"
        for column, expr in assignments) + "\n"


DEBOUNCE_UPSERT = {form: _unless_resent(text, form) for form, text in DEBOUNCE_UPSERT.items()}

#: the columns each decision reads back (RETURNING, or the SELECT after it)
LOCK_RESULT = "owner, nonce, chain"
DEBOUNCE_RESULT = "message_id, absorbed"

# Claim a due burst of this message (due by the caller's clock, as its countdown was), in one
# statement (PostgreSQL, SQLite: ``UPDATE … RETURNING``): the row moves to its claim record's
# key (S7: count 0, kept until {until}); its latest arguments and ids come back. Parameters:
# the record's key, the {until} ones, key, message id, due.
CLAIM_MOVE = """
UPDATE {t} SET {k} = %s, count = 0, expires_at = {until}
WHERE {k} = %s AND message_id = %s AND runs_at <= %s
RETURNING latest_id, payload, absorbed
"""


def in_time(values: str, now: str, form: str) -> str:
    """S7: the row a dispatch upsert inserts (``VALUES (…)``) as a ``SELECT`` of it that
    yields nothing once the server's now is past the caller's deadline (one more parameter,
    after the values' and ``now``'s): the statement then inserts and updates nothing, and
    returns no row."""
    assert values.startswith("VALUES (") and values.endswith(")"), values
    dual = " FROM DUAL" if template(form) == "duplicate_key" else ""
    return f"SELECT {values[len('VALUES ('):-1]}{dual} WHERE {now} <= %s"


def dialect(connection: BaseDatabaseWrapper) -> str | None:
    """The form of the one-statement decisions this database takes (see the module's doc)."""
    if connection.vendor == "postgresql":
        return "on_conflict"
    if connection.vendor == "sqlite":
        import sqlite3

        return "on_conflict" if sqlite3.sqlite_version_info >= (3, 35) else None
    if connection.vendor == "mysql":
        mariadb = getattr(connection, "mysql_is_mariadb", False)
        if mariadb and connection.mysql_version >= (10, 5):  # type: ignore[attr-defined]
            return "duplicate_key"
        return "duplicate_key_read"
    return None


#: the forms whose statements return the row they decided on (RETURNING)
RETURNING_FORMS = ("on_conflict", "duplicate_key")


def template(form: str) -> str:
    """The statement texts of ``form`` (MySQL's reads back what MariaDB's returns)."""
    return "duplicate_key" if form == "duplicate_key_read" else form


def decide(
    connection: BaseDatabaseWrapper, form: str, statement: str, params: list[Any], *,
    names: dict[str, str], key: str, result: str,
) -> list[tuple[Any, ...]]:
    """Run one upsert and read the row it decided on: ``RETURNING result``, or (MySQL) a
    ``SELECT result`` in the upsert's transaction, while the upsert's lock holds the row."""
    with connection.cursor() as cursor:
        if form in RETURNING_FORMS:
            cursor.execute(f"{statement}RETURNING {result}", params)
            # fetchall, not fetchone: SQLite holds the write lock until RETURNING is drained.
            return list(cursor.fetchall())
        with transaction.atomic(using=connection.alias):
            cursor.execute(statement, params)
            cursor.execute(f"SELECT {result} FROM {names['t']} WHERE {names['k']} = %s", [key])
            return list(cursor.fetchall())


def names(connection: BaseDatabaseWrapper, table: str) -> dict[str, str]:
    """The quoted table and "key" column (``key`` is a reserved word in MySQL, and double
    quotes are a string there)."""
    quote = connection.ops.quote_name
    return {"t": quote(table), "k": quote("key")}
