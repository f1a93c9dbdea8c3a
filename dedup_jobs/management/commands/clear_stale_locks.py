"""``manage.py clear_stale_locks``: remove held locks nobody will release (SPEC A2)."""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.connection import ConnectionDoesNotExist

from dedup_jobs import clock
from dedup_jobs.conf import app_settings, is_seconds, not_finite
from dedup_jobs.django_tasks import registry as django_tasks
from dedup_jobs.engine import debounce
from dedup_jobs.exceptions import DedupError, StoreUnavailable
from dedup_jobs.jobs import bursts, registry
from dedup_jobs.jobs.base import DedupJob
from dedup_jobs.jobs.debounced import DebouncedJob
from dedup_jobs.keys import JobKey
from dedup_jobs.signals import lock_released, notify
from dedup_jobs.stale import BackendUnavailable, OwnerStates, Presence, pending_bursts
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import RUNNING, BaseStore, LockInfo

BATCH = 500
PROGRESS_EVERY = 10_000


def positive_seconds(value: str) -> float:
    """argparse type: a number of seconds above 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (is_seconds(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{value!r} must be a number of seconds above 0"
                                         f"{not_finite(seconds)}")
    return seconds


def batched(locks: Iterator[LockInfo], size: int) -> Iterator[list[LockInfo]]:
    while batch := list(itertools.islice(locks, size)):
        yield batch


class Command(BaseCommand):
    help = (
        "Remove stale dedup_jobs locks: locks whose owner task finished (result backend), "
        "expired rows of the database store, and with --older-than locks older than that whose "
        "owner no worker reports and no queue holds. Never removes the lock of a running job. "
        "Also removes overdue debounce bursts (not run by their due time plus LEASE_SECONDS)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Remove nothing; list each lock that would be removed (job, id, owner, why).",
        )
        parser.add_argument(
            "--job", metavar="NAME", help="Only locks of this job (its Celery task name)."
        )
        parser.add_argument(
            "--store",
            metavar="ALIAS",
            help="Only this store (a CACHES alias or 'database'); default: "
            "every store the registered jobs use.",
        )
        parser.add_argument(
            "--older-than",
            metavar="SECONDS",
            type=positive_seconds,
            help="Also remove locks older than this whose owner task no worker "
            "reports (inspect) and no broker queue holds.",
        )
        parser.add_argument(
            "--all",
            action="store_true",
            dest="remove_all",
            help="Remove every queued lock (never a running job's); needs --yes.",
        )
        parser.add_argument("--yes", action="store_true", help="Confirm --all.")
        parser.add_argument(
            "--inspect-timeout",
            metavar="SECONDS",
            type=positive_seconds,
            default=1.0,
            help="Seconds to wait for workers' inspect replies.",
        )

    def handle(
        self,
        *args: Any,
        dry_run: bool,
        job: str | None,
        store: str | None,
        older_than: float | None,
        remove_all: bool,
        yes: bool,
        inspect_timeout: float,
        verbosity: int,
        **options: Any,
    ) -> None:
        if remove_all and not (yes or dry_run):
            raise CommandError(
                "--all removes every lock that is not held by a running job; "
                "add --yes to confirm (or --dry-run to see them first)."
            )
        if yes and not remove_all:
            raise CommandError("--yes only confirms --all; drop it or add --all.")
        jobs = registry.dedup_jobs()
        tasks = django_tasks.unique_tasks()
        if job is not None and job not in {j.name for j in jobs} and (
                django_tasks.find(job) is None):
            names = ", ".join([*(j.name for j in jobs), *(t.dedup.label for t in tasks)])
            raise CommandError(f"--job {job!r} is not a registered dedup job or unique Django "
                               f"task (known: {names or 'none registered'}).")
        self.dry_run, self.job, self.verbosity = dry_run, job, verbosity
        self.older_than, self.remove_all = older_than, remove_all
        self.senders: dict[str, Any] = {j.name: type(j) for j in jobs}
        self.senders.update({t.dedup.label: t for t in tasks})  # K4: a Django task itself
        self.owner_states = OwnerStates(registry.celery_app())
        self.presence = Presence(registry.celery_app(), timeout=inspect_timeout)
        self.totals: Counter[str] = Counter()
        aliases = [store] if store else list(dict.fromkeys(
            [*registry.store_aliases(jobs), *(t.dedup.store_alias() for t in tasks)]))
        for alias in aliases:
            self._store(alias, explicit=store is not None)
        self._summary()

    # -- per store ----------------------------------------------------------------------

    def _store(self, alias: str, *, explicit: bool) -> None:
        try:
            target = get_store(alias)
        except DedupError as exc:
            raise CommandError(f"--store {alias!r}: {exc}") from exc
        if not target.can_list:
            if explicit:
                raise CommandError(
                    f"store {alias!r} cannot be cleared: {target.cannot_list_reason}"
                )
            self.totals["stores skipped"] += 1
            self._say(f"store {alias!r} skipped: {target.cannot_list_reason}")
            return
        try:
            self._expired_rows(target)
            self._bursts(target)
            scanned = 0
            for batch in batched(target.iter_locks(batch_size=BATCH), BATCH):
                self._batch(target, batch)
                before, scanned = scanned, scanned + len(batch)
                if scanned // PROGRESS_EVERY > before // PROGRESS_EVERY:
                    self._say(f"… {scanned} locks scanned in store {alias!r}")
        except StoreUnavailable as exc:
            raise CommandError(str(exc)) from exc
        except ConnectionDoesNotExist as exc:
            raise CommandError(
                f"store {alias!r}: {exc} (DEDUP_JOBS['DATABASE_ALIAS'] = "
                f"{app_settings.DATABASE_ALIAS!r}). Name a DATABASES entry there.") from exc
        except BackendUnavailable as exc:
            raise CommandError(
                f"the Celery result backend could not be read ({exc}); nothing more was removed."
            ) from exc
        trim = getattr(target, "trim_index", None)
        if trim is not None and not self.dry_run:
            try:
                trim()
            except StoreUnavailable as exc:
                cause = exc.__cause__ or exc
                raise CommandError(
                    f"store {alias!r}: the index trim failed ({type(cause).__name__}: {cause}). "
                    "The locks above were handled; the index entries of expired locks stay "
                    "until later decisions trim them, or run the command again."
                ) from exc

    def _expired_rows(self, target: BaseStore) -> None:
        """The database store leaves expired rows behind: remove them (still expired)."""
        iter_expired = getattr(target, "iter_expired", None)
        if iter_expired is None:
            return
        for lock in iter_expired(batch_size=BATCH):
            if self.job is None or lock.task_name == self.job:
                self._remove(target, lock, "expired row", expired=True)

    def _bursts(self, target: BaseStore) -> None:
        """D9: debounce bursts no worker claimed by their due time plus LEASE_SECONDS (their
        message is lost) go; the dispatches they absorbed end REVOKED."""
        for state, overdue in pending_bursts(target, job=self.job, batch_size=BATCH):
            self.totals["bursts scanned"] += 1
            if not overdue:
                continue
            label = (f"debounce burst {printable(state.task_name)}[{printable(state.ident)}] "
                     f"in {target.alias!r}, message {printable(state.message_id)}")
            reason = "overdue: not run by its due time plus LEASE_SECONDS, message lost"
            if self.dry_run:
                self.totals["bursts would remove"] += 1
                self._say(f"would remove {label}: {reason}")
                continue
            key = JobKey(key=state.key, task_name=state.task_name, ident=state.ident)
            if self._burst_task_waits(state.task_name, state.message_id):
                self.totals["bursts kept: task still queued"] += 1
                self._say(f"kept {label}: its Django task is still queued or running", level=2)
                continue
            job = registry.job_named(state.task_name)
            why = f"debounce burst released by clear_stale_locks: {reason}"
            if isinstance(job, DebouncedJob):
                removed = bursts.release(job, target, key, state.message_id, why)
            else:
                removed = debounce.take(target, key, state.message_id) is not None
            self.totals["bursts removed" if removed else "bursts changed meanwhile"] += 1
            self._say(f"{'removed' if removed else 'kept'} {label}: {reason}", level=2)

    @staticmethod
    def _burst_task_waits(task_name: str, message_id: str) -> bool:
        """K4: a debounced Django task's burst whose task (its message) the task backend
        still holds, READY or RUNNING: a stopped worker, not a lost message. Kept: removing
        the burst would run that task with its first arguments, not the latest."""
        task = django_tasks.find(task_name)
        if task is None:
            return False
        try:
            _asked, status = django_tasks.status_of(task, message_id)
        except Exception:
            return True  # the backend cannot say: keep it (the next run decides)
        return status is not None and status not in django_tasks.FINISHED

    def _batch(self, target: BaseStore, batch: list[LockInfo]) -> None:
        locks = [lock for lock in batch if self.job is None or lock.task_name == self.job]
        self.totals["scanned"] += len(locks)
        queued = [lock for lock in locks if lock.state != RUNNING]
        self.totals["kept: running"] += len(locks) - len(queued)
        if self.remove_all:
            for lock in queued:
                self._remove(target, lock, "--all (queued, not running)")
            return
        queued = self._django_tasks(target, queued)
        finished = self.owner_states.finished([lock.owner for lock in queued])
        old: list[LockInfo] = []
        for lock in queued:
            if lock.owner in finished:
                self._remove(target, lock, f"owner task finished ({finished[lock.owner]})")
            elif self.older_than and lock.acquired_at < clock.now() - self.older_than:
                old.append(lock)
            else:
                self.totals["kept: owner pending"] += 1
        if old:
            gone, seen = self.presence.unseen(lock.owner for lock in old)
            for lock in old:
                if lock.owner in gone:
                    self._remove(
                        target,
                        lock,
                        f"older than {self.older_than:g} s, owner not on any worker or queue",
                    )
            self.totals["kept: owner on a worker or queue"] += len(
                [lock for lock in old if lock.owner in seen]
            )

    def _django_tasks(self, target: BaseStore, locks: list[LockInfo]) -> list[LockInfo]:
        """K4: the locks of unique Django tasks, decided by their task backend's result (a
        finished result, or none at all once the lock is older than LEASE_SECONDS: an
        enqueue that died before its commit); the other locks, for Celery's backend."""
        rest: list[LockInfo] = []
        now = clock.now()
        for lock in locks:
            task = django_tasks.find(lock.task_name)
            if task is None:
                rest.append(lock)
                continue
            self.senders.setdefault(lock.task_name, task)
            try:
                state = django_tasks.finished(task, lock.owner, acquired_at=lock.acquired_at,
                                              not_found_after=app_settings.LEASE_SECONDS,
                                              now=now)
            except Exception as exc:
                self._say(f"kept {printable(lock.task_name)}[{printable(lock.ident)}]: its "
                          f"task backend could not be read ({exc})", level=2)
                self.totals["kept: task backend unavailable"] += 1
                continue
            if state is None:
                self.totals["kept: owner pending"] += 1
            elif state == "not found":
                self._remove(target, lock, "owner task not found in its task backend")
            else:
                self._remove(target, lock, f"owner task finished ({state})")
        return rest

    # -- output -------------------------------------------------------------------------

    def _remove(
        self, target: BaseStore, lock: LockInfo, reason: str, *, expired: bool = False
    ) -> None:
        label = (
            f"{printable(lock.task_name)}[{printable(lock.ident)}] in {target.alias!r}, "
            f"owner {printable(lock.owner)}"
        )
        if self.dry_run:
            # A2: every lock a dry run would remove, one a line, at the default verbosity.
            self.totals["would remove"] += 1
            self._say(f"would remove {label}: {reason}")
            return
        key = _key(lock)
        if expired:
            removed = target.release_expired(key, lock.owner, now=clock.now())  # type: ignore[attr-defined]
        else:
            removed = target.release_queued(key, lock.owner)
        if not removed:
            self.totals["kept: changed meanwhile"] += 1
            self._say(
                f"kept {label}: it changed meanwhile (released, re-taken or started)", level=2
            )
            return
        self.totals["removed"] += 1
        notify(  # send_robust: a raising receiver stops no release
            lock_released,
            self.senders.get(lock.task_name, DedupJob),
            key=lock.key,
            owner=lock.owner,
            store=target.alias,
            reason="command",
        )
        self._say(f"removed {label}: {reason}", level=2)

    def _say(self, text: str, *, level: int = 1) -> None:
        if self.verbosity >= level:
            self.stdout.write(text)

    def _summary(self) -> None:
        for note in self.presence.notes:
            self.stdout.write(self.style.WARNING(note))
        if not self.owner_states.enabled:
            self.stdout.write(
                self.style.WARNING(
                    "the Celery result backend is disabled: finished owners cannot be detected "
                    "(use --older-than)."
                )
            )
        if self.totals["bursts scanned"]:
            verb = "would remove" if self.dry_run else "removed"
            self.stdout.write(
                f"{self.totals['bursts scanned']} pending debounce bursts scanned: {verb} "
                f"{self.totals[f'bursts {verb}']} overdue."
            )
        done = (
            f"would remove {self.totals['would remove']}"
            if self.dry_run
            else f"removed {self.totals['removed']}"
        )
        kept = ", ".join(
            f"{name.removeprefix('kept: ')} {count}"
            for name, count in sorted(self.totals.items())
            if name.startswith("kept: ") and count
        )
        self.stdout.write(
            self.style.SUCCESS(
                f"{self.totals['scanned']} held locks scanned: {done}"
                + (f"; kept {kept}" if kept else "")
                + "."
            )
        )


def printable(text: str) -> str:
    """``text`` with its unprintable characters (newlines, NUL, ...) escaped as Python
    would write them, so that one lock stays on one line of output."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _key(lock: LockInfo) -> Any:
    return JobKey(key=lock.key, task_name=lock.task_name, ident=lock.ident)
