"""Chains: a dedup job that is a link of a chain, and the links that come after it.

D8: a DebouncedJob that is a link of a chain is debounced like any dispatch. The dispatch
(the first link's from the caller; a later link's from the worker that ran the link before
it) carries the chain's later links in ``options["chain"]``: signature dicts, the next link
last. Where they go:

- Into the stored payload (``encode_call(args, kwargs, links)``), so that the claim returns
  the latest dispatch's links and the run continues the *winner's* chain:
  :func:`follow_winner` replaces ``request.chain`` before the body runs, and Celery's tracer
  dispatches ``task_request.chain`` (the request on the task's stack, this very object) after
  the body returned (celery/app/trace.py, ``_dispatch_callbacks_and_chain``; checked on
  Celery 5.7.0 and 5.5). On failure Celery's ``mark_as_failure`` fails those links.
- The burst's first dispatch publishes the burst's message with its own links (what runs
  when the state is lost, D7). If it was superseded, the run marks them REVOKED.
- A dispatch absorbed and superseded later is known to the run by its id only (the store
  keeps the latest payload): before it reaches the store a chain dispatch remembers its links
  under its own id in the result backend (:func:`~dedup_jobs.jobs.absorbed.remember_chain`),
  and the run gets them back as it records its outcome under that id (:func:`end_superseded`).

In a group or chord (``group_id``/``chord``, or a chain that goes on into a group or chord) a
DebouncedJob is published as it is: the group's result counts that very id, and revoking a
member would fail the chord instead of running its body.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from celery.app.task import Context

from dedup_jobs.jobs.absorbed import Remembered
from dedup_jobs.jobs.base import logger

Links = list[dict[str, Any]]


def chain_links(options: Mapping[str, Any]) -> Links | None:
    """The later links of a chain dispatch (None when it is no chain link or the last one)."""
    links = options.get("chain")
    return [dict(link) for link in links] if links else None


def in_group(options: Mapping[str, Any], links: Links | None) -> bool:
    """True for a dispatch inside a group or chord, or whose chain goes on into one (the
    chain's last link carries the group id; a group or chord link has a subtask_type)."""
    if options.get("group_id") or options.get("chord"):
        return True
    for link in links or ():
        link_options = link.get("options") or {}
        if link.get("subtask_type") or link_options.get("group_id") or link_options.get("chord"):
            return True
    return False


def links_of(args: Any) -> Links | None:
    """The chain links carried by arguments decoded from a stored payload (CallArgs)."""
    links = getattr(args, "chain", None)
    return list(links) if links else None


def revoke_links(backend: Any, links: Iterable[Mapping[str, Any]], reason: str) -> None:
    """The later links of a chain that does not continue never run: mark each REVOKED, so
    that the chain's result (its last link) is ready and a chord it belongs to is told."""
    for link in links:
        # a group's or chord's members (a chord's body too) never run either: their results
        # are what the caller's GroupResult or chord waits on
        revoke_links(backend, _members(link), reason)
        options = dict(link.get("options") or {})
        task_id = options.get("task_id")
        if not task_id:
            continue  # a nested canvas without an id of its own
        context = Context({**link, **options, "id": task_id, "group": options.get("group_id")})
        try:
            backend.mark_as_revoked(task_id, reason=reason, request=context)
        except Exception:
            logger.warning(
                "Could not mark chain link %s REVOKED; its result stays PENDING.",
                task_id,
                exc_info=True,
            )


def _members(link: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The signatures inside a canvas link: a group's or chain's tasks, a chord's header and
    body ([] for a task)."""
    kind, kwargs = link.get("subtask_type"), link.get("kwargs") or {}
    if kind in ("group", "chain"):
        return [t for t in kwargs.get("tasks") or () if isinstance(t, Mapping)]
    if kind == "chord":
        header = kwargs.get("header") or {}
        members = _members(header) if isinstance(header, Mapping) else list(header)
        body = kwargs.get("body")
        return [*members, *([body] if isinstance(body, Mapping) else [])]
    return []


def superseded_reason(dispatch: str, winner: str | None, run: str) -> str:
    """The REVOKED reason of a superseded dispatch's later links: names the winning
    dispatch and the run that absorbed it."""
    return (
        f"debounced: the chain of dispatch {dispatch} does not continue; dispatch "
        f"{winner or 'unknown'} superseded it and task {run} ran the burst"
    )


def follow_winner(backend: Any, request: Any, owner: str, winner: str, links: Links | None) -> None:
    """The burst's message ``owner`` runs with ``winner``'s arguments: its own later links
    end REVOKED, and the winner's chain is what Celery continues after the run."""
    if winner == owner:
        return
    own = request.chain
    if own:
        revoke_links(backend, own, superseded_reason(owner, winner, owner))
    request.chain = links


def end_superseded(backend: Any, found: Remembered, winner: str | None, run: str) -> None:
    """The chains remembered under absorbed ids (all superseded but the winner's, which goes
    on from the run) end REVOKED."""
    for dispatch, links in found.items():
        if dispatch != winner:
            revoke_links(backend, links, superseded_reason(dispatch, winner, run))


def revoke_rest_of_chain(job: Any, reason: str) -> None:
    """The later links of a skipped chain link never run: they end REVOKED, so that the
    chain's result (its last link) is ready, and a chord they belong to is told."""
    request = job.request
    links: Any = request.chain or ()
    revoke_links(job.backend, links,
                 f"an earlier link of its chain ({request.id}) was skipped: {reason}")
