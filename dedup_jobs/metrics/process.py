"""This process's tally and the exporters that hand its counts on, below both the counting
functions (:mod:`dedup_jobs.metrics`, which re-exports all of this) and the metrics thread
(:mod:`dedup_jobs.metrics.history`), so that neither imports the other back."""

from __future__ import annotations

import importlib.util
import threading
from typing import Protocol

from dedup_jobs.metrics.tally import Tally


class Exporter(Protocol):
    def sync(self) -> None:
        """Hand what the tally counted since the last sync on (off the decision path)."""


#: the tally of this process (see dedup_jobs.metrics.history for where it goes)
tally = Tally()

#: (module of ours, library it needs): loaded when the library is installed
EXPORTERS = (
    ("dedup_jobs.metrics.prometheus", "prometheus_client"),
    ("dedup_jobs.metrics.otel", "opentelemetry.metrics"),
)

_exporters: list[Exporter] | None = None
_loading = threading.Lock()


def _installed(name: str) -> bool:
    top = name.partition(".")[0]
    try:
        return importlib.util.find_spec(top) is not None and importlib.util.find_spec(
            name) is not None
    except (ImportError, ValueError):
        return False


def exporters() -> list[Exporter]:
    """The exporters of this process that need a :meth:`~Exporter.sync` now and then (the
    others read the tally when they are collected), loaded on first use."""
    global _exporters
    found = _exporters
    if found is None:
        with _loading:
            found = _exporters
            if found is None:
                found = []
                for module, library in EXPORTERS:
                    if _installed(library):
                        made = importlib.import_module(module).exporter()
                        if made is not None:  # None: it reads the tally when collected
                            found.append(made)
                _exporters = found
    return found


def loaded() -> list[Exporter]:
    """The exporters :func:`exporters` has loaded so far (none before its first call),
    without loading them."""
    return _exporters or []


def sync() -> None:
    """Hand the tally's counts on to the exporters that keep their own values (a
    prometheus_client multi-process directory). The metrics thread does it every
    ``SYNC_SECONDS``, and a process does it once more as it exits."""
    for exporter in exporters():
        exporter.sync()
