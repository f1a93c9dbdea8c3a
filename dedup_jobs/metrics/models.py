"""The admin Overview's history (A5): what every process counted, flushed in time buckets by
:mod:`dedup_jobs.metrics.history`. Bounded: 10-second buckets are kept an hour, minute
buckets a day, hour buckets 31 days, day buckets a year; key counts and store latency a
day (docs/monitoring.md says what a year costs)."""

from __future__ import annotations

from django.db import models

FINE, MINUTE, HOUR, DAY = 10, 60, 3600, 86400
#: seconds each resolution's buckets are kept
KEEP = {FINE: HOUR, MINUTE: DAY, HOUR: 31 * DAY, DAY: 366 * DAY}


class DecisionCount(models.Model):
    """Decisions of one job with one outcome in one bucket, summed over every process."""

    resolution = models.PositiveIntegerField()  # FINE, MINUTE, HOUR or DAY
    start = models.BigIntegerField()  # epoch seconds the bucket starts at
    job = models.CharField(max_length=255)
    outcome = models.CharField(max_length=32)
    count = models.BigIntegerField(default=0)

    class Meta:
        app_label = "dedup_jobs"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["resolution", "start", "job", "outcome"],
                                               name="dedup_jobs_decision_bucket")]

    def __str__(self) -> str:
        return f"{self.job} {self.outcome} x{self.count} @{self.start}/{self.resolution}"


class KeyCount(models.Model):
    """Decisions at one key in one hour: ``count`` duplicates prevented (deduplicated,
    skipped, superseded, replaced), ``deferred`` deferrals (a message re-published to wait)."""

    start = models.BigIntegerField()  # epoch seconds of the hour
    digest = models.CharField(max_length=40)  # sha1 of the key: keys may be long
    job = models.CharField(max_length=255)
    key = models.TextField()
    count = models.BigIntegerField(default=0)
    deferred = models.BigIntegerField(default=0)

    class Meta:
        app_label = "dedup_jobs"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["start", "digest"],
                                               name="dedup_jobs_key_bucket")]

    def __str__(self) -> str:
        return f"{self.key} x{self.count} @{self.start}"


class StoreLatency(models.Model):
    """Store calls of one store in one minute that fell in one latency bucket (``slot``, an
    index into ``LATENCY_BUCKETS``; the last is +Inf)."""

    start = models.BigIntegerField()
    store = models.CharField(max_length=255)
    slot = models.PositiveSmallIntegerField()
    count = models.BigIntegerField(default=0)

    class Meta:
        app_label = "dedup_jobs"
        default_permissions = ()
        constraints = [models.UniqueConstraint(fields=["start", "store", "slot"],
                                               name="dedup_jobs_latency_bucket")]

    def __str__(self) -> str:
        return f"{self.store}[{self.slot}] x{self.count} @{self.start}"


class StoreError(models.Model):
    """The last store error seen by any process, per store alias."""

    store = models.CharField(max_length=255, unique=True)
    at = models.FloatField()  # epoch seconds
    message = models.TextField()

    class Meta:
        app_label = "dedup_jobs"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.store}: {self.message}"
