"""D9, A1: the admin's *Debounced jobs* page marks a burst not run by its due time plus
LEASE_SECONDS as overdue and releases it through *Release selected overdue bursts* (POST,
CSRF, a confirmation page, its own permission), on every store that lists bursts."""

from __future__ import annotations

import re
from typing import Any

import pytest
from celery import states
from django.test import Client

from dedup_jobs import clock
from tests import admin_helpers
from tests import jobs_debounce as jobs
from tests.admin_helpers import PASSWORD, make_user
from tests.test_admin import DEBOUNCES, selected_values

listed_store = admin_helpers.listed_store

#: LEASE_SECONDS' default, plus debounce_record's max_wait (3 s) and some
LATER = 60 + 3 + 10


def burst(item: int) -> Any:
    return jobs.debounce_record.store().get_debounce(jobs.debounce_record.job_key((item, 0), {}))


@pytest.fixture
def overdue(app: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Two bursts whose messages were purged, made overdue by moving the clock; then a
    third burst dispatched at the moved time (not overdue)."""
    lost = [jobs.debounce_record.delay(item, 1) for item in (51, 52)]
    real = clock.now
    monkeypatch.setattr(clock, "now", lambda: real() + LATER)
    jobs.debounce_record.delay(53, 1)
    app.control.purge()
    return lost


def test_overdue_bursts_are_marked_and_released(listed_store: str, overdue: list[Any]) -> None:
    """D9/A1: overdue bursts are marked and only they can be ticked; the action is a POST
    with CSRF that confirms first, then releases each (its dispatches end REVOKED)."""
    client = Client(enforce_csrf_checks=True)
    make_user("releaser", "view_joblock", "release_pendingdebounce")
    assert client.login(username="releaser", password=PASSWORD)
    html = client.get(DEBOUNCES).content.decode()
    assert html.count("its message is lost") == 2, html
    assert "Release selected overdue bursts" in html
    values = selected_values(html)
    assert sorted(v.split('"')[-2] for v in values) == ["item=51", "item=52"]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    form = {"action": "release_overdue", "_selected_action": values}
    assert client.post(DEBOUNCES, form).status_code == 403  # no CSRF token
    confirm = client.post(DEBOUNCES, {**form, "csrfmiddlewaretoken": token})
    assert "Are you sure you want to release these overdue debounce bursts" in (
        confirm.content.decode())
    assert burst(51) is not None
    done = client.post(DEBOUNCES, {**form, "post": "yes", "csrfmiddlewaretoken": token})
    assert done.status_code == 302
    assert "Released 2 bursts." in client.get(done["Location"]).content.decode()
    assert burst(51) is None and burst(52) is None and burst(53) is not None
    assert [r.state for r in overdue] == [states.REVOKED] * 2


def test_release_of_bursts_needs_its_permission(listed_store: str, overdue: list[Any]) -> None:
    """A1: without dedup_jobs.release_pendingdebounce no action is offered and a forged
    POST is refused (403); the burst stays. A burst that is not overdue is never released
    (a forged value for it is left alone)."""
    viewer = Client()
    make_user("viewer", "view_joblock")
    assert viewer.login(username="viewer", password=PASSWORD)
    html = viewer.get(DEBOUNCES).content.decode()
    assert "its message is lost" in html and "Release selected overdue bursts" not in html
    state = burst(51)
    value = f'["{state.key}", "{state.message_id}", "{state.task_name}", "{state.ident}"]'
    form = {"action": "release_overdue", "_selected_action": [value], "post": "yes"}
    assert viewer.post(DEBOUNCES, form).status_code == 403
    assert burst(51) is not None
    releaser = Client()
    make_user("releaser", "view_joblock", "release_pendingdebounce")
    assert releaser.login(username="releaser", password=PASSWORD)
    waiting = burst(53)
    forged = f'["{waiting.key}", "{waiting.message_id}", "{waiting.task_name}", "{waiting.ident}"]'
    done = releaser.post(DEBOUNCES, {**form, "_selected_action": [forged]}, follow=True)
    assert "1 burst was not released" in done.content.decode()
    assert burst(53) is not None
