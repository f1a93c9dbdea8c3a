"""The database store's model: one row per held lock, unique on ``key``."""

from __future__ import annotations

from django.db import models

from dedup_jobs.stores.database.servertime import ServerNow


class JobLockQuerySet(models.QuerySet["JobLock"]):
    """``held()`` / ``expired()`` compare against the database server's clock (S3)."""

    def held(self) -> JobLockQuerySet:
        return self.filter(expires_at__gt=ServerNow())

    def expired(self) -> JobLockQuerySet:
        return self.filter(expires_at__lte=ServerNow())


class JobLock(models.Model):
    key = models.CharField(max_length=512, unique=True)
    task_name = models.CharField(max_length=255, db_index=True)
    ident = models.TextField("unique id", blank=True)
    owner = models.CharField("owner task id", max_length=255)
    state = models.CharField(max_length=16, default="queued")
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    # Set per acquire call so one statement can tell "taken now" from "already held".
    nonce = models.CharField(max_length=40, default="", editable=False)
    #: R1/S7: the queued holders a take-over replaced, newest first, as JSON ``[[owner,
    #: nonce], …]`` (at most 16; "" for none): an undo of the failed take-over gives the lock
    #: back, and the replaced holder's worker check is told it was taken over
    chain = models.TextField(blank=True, default="", editable=False)
    #: L2: on a running marker, a dispatch's request that the run stop, as JSON ``[the
    #: marker's owner, the dispatch's owner]`` (NULL: none; a request naming another owner
    #: than the marker's is a stale one, of an earlier run of the key, and is ignored). NULL,
    #: not "", so that the raw statements that insert rows need not name the column.
    cancel = models.TextField(null=True, blank=True, editable=False)  # noqa: DJ001

    objects = JobLockQuerySet.as_manager()

    class Meta:
        app_label = "dedup_jobs"
        verbose_name = "held lock"
        verbose_name_plural = "held locks"
        ordering = ("expires_at",)
        permissions = [("release_joblock", "Can release held locks")]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.ident}] held by {self.owner}"


class PendingDebounceQuerySet(models.QuerySet["PendingDebounce"]):
    """``pending()`` / ``expired()`` compare against the database server's clock (S3).
    ``pending()`` leaves out claim records (``count`` 0: a claimed burst kept under
    :func:`claim_record_key` for a claim made again, S7)."""

    def pending(self) -> PendingDebounceQuerySet:
        return self.filter(expires_at__gt=ServerNow(), count__gt=0)

    def expired(self) -> PendingDebounceQuerySet:
        return self.filter(expires_at__lte=ServerNow())


class PendingDebounce(models.Model):
    """One burst of a debounced job that has not run yet (the database store's debounce
    state). The row is deleted when the burst's message claims it to run."""

    key = models.CharField(max_length=512, unique=True)
    task_name = models.CharField(max_length=255, db_index=True)
    ident = models.TextField("debounce id", blank=True)
    message_id = models.CharField("message task id", max_length=255)
    latest_id = models.CharField("latest dispatch id", max_length=255)
    superseded_id = models.CharField(max_length=255, blank=True)
    payload = models.TextField("latest arguments")
    #: the arguments before the latest dispatch's (for the undo of a failed dispatch, S7)
    previous_payload = models.TextField(blank=True, default="")
    count = models.PositiveIntegerField("dispatches", default=1)
    first_dispatch_at = models.DateTimeField()
    last_dispatch_at = models.DateTimeField()
    run_at = models.DateTimeField()
    deadline = models.DateTimeField("max-wait deadline", null=True, blank=True)
    runs_at = models.DateTimeField(db_index=True)
    expires_at = models.DateTimeField(db_index=True)
    absorbed = models.TextField("dispatch ids", blank=True)

    objects = PendingDebounceQuerySet.as_manager()

    class Meta:
        app_label = "dedup_jobs"
        verbose_name = "debounced job"
        verbose_name_plural = "debounced jobs"
        ordering = ("runs_at",)
        permissions = [("release_pendingdebounce", "Can release overdue debounced jobs")]

    def __str__(self) -> str:
        return f"{self.task_name}[{self.ident}] x{self.count}, runs at {self.runs_at}"


class ThrottleKey(models.Model):
    """One throttle key of the database store (T2-T5): the row every admission decision of
    the key locks first (so decisions of one key are serialized), with what the admin shows.
    Its slots, waiters, starts and reservations are :class:`ThrottleEntry` rows."""

    key = models.CharField(max_length=512, unique=True)
    task_name = models.CharField(max_length=255, db_index=True)
    ident = models.TextField("throttle id", blank=True)
    limit = models.CharField(max_length=64, blank=True)
    period = models.FloatField(default=0.0)  # seconds of the rate's window; 0: no rate
    avg_run = models.FloatField(null=True)  # seconds: average run (waiters' countdowns)
    expires_at = models.DateTimeField(db_index=True)  # unused this long: gone

    class Meta:
        app_label = "dedup_jobs"
        verbose_name = "throttle"
        verbose_name_plural = "throttles"
        ordering = ("expires_at",)

    def __str__(self) -> str:
        return f"{self.task_name}[{self.ident}] {self.limit}"


class ThrottleEntry(models.Model):
    """A concurrency slot (``slot``: ``at`` its start, ``expires_at`` its lease), a message
    waiting for one (``wait``: ``at`` when it comes back), a start (``start``, member = the
    delivery nonce) or a reserved start (``res``, ``at`` its time) of a throttle key."""

    throttle = models.ForeignKey(ThrottleKey, on_delete=models.CASCADE, related_name="entries")
    kind = models.CharField(max_length=8)
    member = models.CharField(max_length=255)
    at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        app_label = "dedup_jobs"
        constraints = [models.UniqueConstraint(fields=["throttle", "kind", "member"],
                                               name="dedup_jobs_throttle_entry")]

    def __str__(self) -> str:
        return f"{self.kind} {self.member}"
