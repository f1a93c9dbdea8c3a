"""DebouncedJob: only the last dispatch of a burst runs. (Built in the debounce issue.)"""

from __future__ import annotations

from typing import ClassVar

from dedup_jobs.exceptions import InvalidJobConfiguration
from dedup_jobs.jobs.base import DedupJob


class DebouncedJob(DedupJob):
    dedup_kind: ClassVar[str] = "debounce"
    _key_fields_option = "debounce_on"
    _id_hook = "debounce_id"
    _via_option = "debounce_via"

    debounce_for: float | None = None
    max_wait: float | None = None
    debounce_on: tuple[str, ...] | None = None
    debounce_via: object = None

    @classmethod
    def validate_options(cls) -> None:
        raise InvalidJobConfiguration(
            f"{cls._job_label()}: DebouncedJob is not available in this version yet."
        )
