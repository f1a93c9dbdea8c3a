"""L1 time options as methods of the call (SPEC §12): ``unique_for`` on a UniqueJob,
``debounce_for`` and ``max_wait`` on a DebouncedJob, each depending on the call's plan."""

from __future__ import annotations

from dedup_jobs import DebouncedJob, UniqueJob
from tests.jobs import record


class PerPlanUnique(UniqueJob):
    """A "free" call's lock lives 120 s; "vip" takes the default (None); "bad" answers a
    value that is not seconds."""

    name = "tests.per_plan_unique"

    def unique_for(self, plan: str, n: int = 0) -> float | None:
        return {"free": 120.0, "vip": None}.get(plan, "soon")  # type: ignore[return-value]

    def run(self, plan: str, n: int = 0) -> int:
        record(f"per_plan_unique:{plan}", n)
        return n


class PerPlanDebounced(DebouncedJob):
    """A "free" burst waits 1 s of quiet (at most 30 s); "vip" is not debounced (None);
    "short" answers a max_wait below its debounce_for."""

    name = "tests.per_plan_debounced"
    debounce_on = ("plan",)

    def debounce_for(self, plan: str, n: int = 0) -> float | None:
        return None if plan == "vip" else 1.0

    def max_wait(self, plan: str, n: int = 0) -> float | None:
        return 0.5 if plan == "short" else 30.0

    def run(self, plan: str, n: int = 0) -> int:
        record(f"per_plan_debounced:{plan}", n)
        return n


def _register() -> tuple[PerPlanUnique, PerPlanDebounced]:
    from tests.celery_app import app

    found = app.register_task(PerPlanUnique()), app.register_task(PerPlanDebounced())
    return found  # type: ignore[return-value]


per_plan_unique, per_plan_debounced = _register()
