"""The app's admin section: *Overview*, *Held locks*, *Debounced jobs*, *Throttles*, *Job classes*
(docs/admin.md)."""

from django.contrib import admin

from dedup_jobs.admin.debounces import PendingDebounceAdmin
from dedup_jobs.admin.job_classes import JobClassAdmin
from dedup_jobs.admin.locks import JobLockAdmin
from dedup_jobs.admin.overview import OverviewAdmin
from dedup_jobs.admin.throttles import ThrottleAdmin
from dedup_jobs.models import JobClass, JobLock, Overview, PendingDebounce, ThrottleKey

admin.site.register(JobLock, JobLockAdmin)
admin.site.register(PendingDebounce, PendingDebounceAdmin)
admin.site.register(ThrottleKey, ThrottleAdmin)
admin.site.register(JobClass, JobClassAdmin)
admin.site.register(Overview, OverviewAdmin)
