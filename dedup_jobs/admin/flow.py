"""What the admin shows of a job's flow control (R1-R3): the badges of *Held locks* and the
option cells of *Job classes*, read from the job class's options as they are now."""

from __future__ import annotations

from dataclasses import dataclass

from dedup_jobs.conf import app_settings
from dedup_jobs.django_tasks import registry as django_tasks
from dedup_jobs.jobs.base import DedupJob


@dataclass(frozen=True, kw_only=True)
class Badge:
    """One flow-control option of a job, as a short label and the sentence it stands for."""

    label: str
    css: str
    meaning: str


def observe_only(job: DedupJob) -> tuple[bool, str]:
    """R3: is ``job`` observe-only now, and why ("job option", "DEDUP_JOBS['OBSERVE_ONLY']")?
    Only the unique kinds observe."""
    if job.dedup_kind != "unique":
        return False, ""
    own = getattr(job, "observe_only", None)
    if own is not None:
        return bool(own), "job option"
    return app_settings.OBSERVE_ONLY, "DEDUP_JOBS['OBSERVE_ONLY']"


def overlap_guarded(job: DedupJob) -> bool:
    """R2 in effect: ``without_overlapping`` on an until-processing job (on a UniqueJob the
    lock held while it runs already keeps runs apart: W007)."""
    return bool(getattr(job, "without_overlapping", False)) and bool(
        getattr(job, "release_on_start", False))


def badges(job: DedupJob | None) -> list[Badge]:
    """The badges of a held lock's job: replace (R1), cancel running (L2), no overlap (R2),
    observe-only (R3)."""
    if job is None or job.dedup_kind != "unique":
        return []
    shown = []
    if getattr(job, "on_duplicate", "") == "replace":
        shown.append(Badge(label="replace", css="replace", meaning=(
            "on_duplicate='replace': a dispatch while this lock is queued takes it over and "
            "the queued copy is revoked (R1)")))
    if getattr(job, "on_duplicate", "") == "cancel_running":
        how = ("terminated" if getattr(job, "cancel_terminates", False)
               else "asked to stop (cancel_requested())")
        shown.append(Badge(label="cancel running", css="replace", meaning=(
            f"on_duplicate='cancel_running': a dispatch replaces a queued copy; a running "
            f"one is {how} and the dispatch runs after it (L2)")))
    if overlap_guarded(job):
        shown.append(Badge(label="no overlap", css="no-overlap", meaning=(
            "without_overlapping: a copy that reaches a worker while a run of this key is in "
            "progress waits for it (R2)")))
    observing, why = observe_only(job)
    if observing:
        shown.append(Badge(label="observe-only", css="observe", meaning=(
            f"observe_only ({why}): decisions are reported, nothing is dropped, deferred or "
            f"replaced (R3)")))
    return shown


def framework_badges(task_name: str) -> list[Badge]:
    """K4: the badge of a lock held by a unique Django task (its owner is the task
    backend's result id, not a Celery task id); [] for anything else."""
    task = django_tasks.find(task_name)
    if task is None:
        return []
    return [Badge(label="Django task", css="framework", meaning=(
        f"a Django task ({django_tasks.kind_label(task)}) on the task backend "
        f"{task.backend!r}: its owner is that backend's result id"))]


def option_lines(job: DedupJob) -> list[str]:
    """The *Job classes* "Flow control" cell of a unique job: ``without_overlapping`` (R2)
    and the observe-only mode in effect (R3) with where it comes from; [] when neither (and
    for a DebouncedJob). ``on_duplicate`` (R1) has a column of its own."""
    if job.dedup_kind != "unique":
        return []
    lines = []
    if getattr(job, "without_overlapping", False):
        lines.append("without_overlapping" if overlap_guarded(job)
                     else "without_overlapping (no effect: W007)")
    if getattr(job, "cancel_terminates", False):
        lines.append("cancel_terminates")
    own = getattr(job, "observe_only", None)
    if own is None:
        if app_settings.OBSERVE_ONLY:
            lines.append("observe-only (DEDUP_JOBS)")
    elif own:
        lines.append("observe_only")
    elif app_settings.OBSERVE_ONLY:
        lines.append("observe_only = False (over DEDUP_JOBS)")
    return lines
