"""The admin pages (SPEC A1) through Django's test client, on django-redis and the database
store: permissions, listing, search, filters, pagination, the release action, escaping."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.signals import lock_released
from dedup_jobs.stores import get_store
from tests import admin_helpers, jobs
from tests.admin_helpers import PASSWORD, fill, make_user, unreachable_redis

listed_store = admin_helpers.listed_store  # the fixture, shared by the admin/command tests

LOCKS = "/admin/dedup_jobs/joblock/"
DEBOUNCES = "/admin/dedup_jobs/pendingdebounce/"
CLASSES = "/admin/dedup_jobs/jobclass/"
PAGES = (LOCKS, DEBOUNCES, CLASSES)


def login(username: str, *perms: str, staff: bool = True) -> Client:
    make_user(username, *perms, staff=staff)
    client = Client()
    assert client.login(username=username, password=PASSWORD)
    return client


def selected_values(html: str) -> list[str]:
    import html as html_lib

    return [
        html_lib.unescape(v) for v in re.findall(r'name="_selected_action" value="([^"]*)"', html)
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("page", PAGES)
def test_non_staff_is_sent_to_login(page: str) -> None:
    """A1: a logged-in user who is not staff gets the login page, not the admin page."""
    client = login("plain", "view_joblock", staff=False)
    response = client.get(page)
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


@pytest.mark.django_db
@pytest.mark.parametrize("page", PAGES)
def test_staff_without_view_permission_is_refused(page: str) -> None:
    """A1: staff without the view permission get 403 on every page, and no section on the
    admin index."""
    client = login("staff")
    assert client.get(page).status_code == 403
    index = client.get("/admin/").content.decode()
    assert "Dedup jobs" not in index and "Held locks" not in index


@pytest.mark.django_db
def test_view_permission_opens_the_three_pages() -> None:
    """A1: the view permission on held locks shows all three pages under the app's section."""
    client = login("viewer", "view_joblock")
    index = client.get("/admin/").content.decode()
    for title in ("Dedup jobs", "Held locks", "Debounced jobs", "Job classes"):
        assert title in index
    for page in PAGES:
        assert client.get(page).status_code == 200


def test_held_lock_of_a_real_dispatch_is_listed(listed_store: str) -> None:
    """A1: a dispatch's lock shows with job, readable id, owner task id, state, acquired at
    and expires in."""
    result = jobs.unique_sleep.delay(41)
    client = login("viewer", "view_joblock")
    html = client.get(LOCKS).content.decode()
    assert "tests.unique_sleep" in html
    assert "item=41,seconds=0.0" in html
    assert result.id in html
    assert "queued" in html
    assert re.search(r">(5\d|60) s</td>|>1 min</td>", html)
    assert "Release selected locks" not in html  # no release permission: no action


def test_hashed_id_is_shown_readable(listed_store: str) -> None:
    """A1 / keys: an id longer than 200 characters is hashed in the key but the page shows
    the readable id."""
    long_text = "x" * 250
    jobs.unique_sleep.delay(long_text)
    lock = get_store(listed_store).get(jobs.unique_sleep.job_key((long_text,), {}))
    assert lock is not None and "sha256-" in lock.key
    html = login("viewer", "view_joblock").get(LOCKS).content.decode()
    assert f"item=&quot;{long_text[:150]}" in html


def test_search_filter_and_pagination(listed_store: str) -> None:
    """A1: 100 locks a page with links to the next; search by id and by job name (any case);
    filter by job."""
    fill(listed_store, 130)
    other = build_key("unique", "tests.unique_add", "a=7")
    assert get_store(listed_store).acquire(other, "owner-add", 600, now=clock.now()).acquired
    client = login("viewer", "view_joblock")
    first = client.get(LOCKS).content.decode()
    assert len(re.findall(r'<td class="owner" title="[^"]*">', first)) == 100
    assert "131 held locks" in first and "page 1 of 2" in first
    second = client.get(LOCKS + "?p=2").content.decode()
    assert len(re.findall(r'<td class="owner" title="[^"]*">', second)) == 31
    found = client.get(LOCKS + "?q=ITEM%3D117").content.decode()
    assert re.findall(r'<td class="owner" title="([^"]*)">', found) == ["owner-117"]
    by_name = client.get(LOCKS + "?q=Unique_Add").content.decode()
    assert re.findall(r'<td class="owner" title="([^"]*)">', by_name) == ["owner-add"]
    by_job = client.get(LOCKS + "?job=tests.unique_add").content.decode()
    assert re.findall(r'<td class="owner" title="([^"]*)">', by_job) == ["owner-add"]
    nothing = client.get(LOCKS + "?q=item%3D999").content.decode()
    assert "No held locks match" in nothing


def test_release_action_confirms_then_releases(listed_store: str) -> None:
    """A1: Release selected locks is a POST with CSRF, shows a confirmation page first, then
    compare-and-deletes each lock and sends lock_released(reason="admin") for each."""
    first = jobs.unique_sleep.delay(1)
    second = jobs.unique_sleep.delay(2)
    client = Client(enforce_csrf_checks=True)
    make_user("releaser", "view_joblock", "release_joblock")
    assert client.login(username="releaser", password=PASSWORD)
    page = client.get(LOCKS)
    html = page.content.decode()
    assert "Release selected locks" in html
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]
    values = selected_values(html)
    assert len(values) == 2
    form = {"action": "release_selected", "_selected_action": values}
    assert client.post(LOCKS, form).status_code == 403  # no CSRF token
    confirm = client.post(LOCKS, {**form, "csrfmiddlewaretoken": token})
    assert confirm.status_code == 200
    assert "Are you sure you want to release" in confirm.content.decode()
    assert jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((1,), {})) is not None
    released: list[dict[str, Any]] = []

    def on_release(sender: Any, **kwargs: Any) -> None:
        released.append({"sender": sender, **kwargs})

    lock_released.connect(on_release, weak=False)
    try:
        done = client.post(LOCKS, {**form, "post": "yes", "csrfmiddlewaretoken": token})
    finally:
        lock_released.disconnect(on_release)
    assert done.status_code == 302
    assert jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((1,), {})) is None
    assert jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((2,), {})) is None
    assert sorted(r["owner"] for r in released) == sorted([first.id, second.id])
    assert {r["reason"] for r in released} == {"admin"}
    assert {r["store"] for r in released} == {listed_store}
    assert {r["sender"].name for r in released} == {"tests.unique_sleep"}
    after = client.get(done["Location"]).content.decode()
    assert "Released 2 locks." in after


def test_release_never_deletes_a_newer_owners_lock(listed_store: str) -> None:
    """A1 / U4: the action releases by owner token: a lock re-taken by another task after
    the page was shown is left alone."""
    jobs.unique_sleep.delay(3)
    client = login("releaser", "view_joblock", "release_joblock")
    values = selected_values(client.get(LOCKS).content.decode())
    key = jobs.unique_sleep.job_key((3,), {})
    store = get_store(listed_store)
    holder = store.get(key)
    assert holder is not None and store.release(key, holder.owner)
    assert store.acquire(key, "newer-owner", 600, now=clock.now()).acquired
    form = {"action": "release_selected", "_selected_action": values, "post": "yes"}
    done = client.post(LOCKS, form, follow=True).content.decode()
    assert "1 lock was not released" in done
    current = store.get(key)
    assert current is not None and current.owner == "newer-owner"


def test_release_needs_its_permission(listed_store: str) -> None:
    """A1: without dedup_jobs.release_joblock the action is refused (403), lock kept."""
    jobs.unique_sleep.delay(4)
    client = login("viewer", "view_joblock")
    lock = jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((4,), {}))
    assert lock is not None
    value = f'["{lock.key}", "{lock.owner}", "{lock.task_name}", "{lock.ident}"]'
    form = {"action": "release_selected", "_selected_action": [value], "post": "yes"}
    assert client.post(LOCKS, form).status_code == 403
    assert jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((4,), {})) is not None


def test_arguments_are_escaped(listed_store: str) -> None:
    """A1: job arguments are always HTML-escaped (a <script> shows as text)."""
    jobs.unique_sleep.delay("<script>alert('x')</script>")
    html = login("viewer", "view_joblock").get(LOCKS).content.decode()
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html


@pytest.mark.django_db
def test_a_cache_that_cannot_list_says_why() -> None:
    """A1: on a store that cannot list (locmem) the page says plainly why."""
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": "locmem"}):
        html = login("viewer", "view_joblock").get(LOCKS).content.decode()
    assert "This store cannot be listed" in html
    assert "use a django-redis cache or the database store" in html


@pytest.mark.django_db
def test_unreachable_redis_is_reported_not_a_crash() -> None:
    """A1 / S4: a store that does not answer shows an error on the page (no 500)."""
    caches = unreachable_redis()
    with override_settings(CACHES=caches):
        response = login("viewer", "view_joblock").get(LOCKS + "?store=redis")
    assert response.status_code == 200
    assert "is unavailable" in response.content.decode()


@pytest.mark.django_db
def test_job_classes_lists_every_registered_job() -> None:
    """A1: Job classes shows every registered dedup job with kind, store, unique_for and key
    fields."""
    from tests import jobs_debounce  # noqa: F401 - registers the debounced jobs

    html = login("viewer", "view_joblock").get(CLASSES).content.decode().replace("<wbr>", "")
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"<th class=\"field-job\" title=\"[^\"]*\">([^<]+)</th>(.*?)</tr>",
                             html, re.S)
    }
    assert {
        "tests.unique_sleep",
        "tests.unique_add",
        "tests.until_processing",
        "tests.recalculate_invoice",
    } <= set(rows)
    assert "UniqueUntilProcessingJob" in rows["tests.until_processing"]
    assert '<td class="seconds">1\xa0min</td>' in rows["tests.unique_add"]
    assert '<td class="ident">a</td>' in rows["tests.unique_add"]
    assert "unique_id()" in rows["tests.recalculate_invoice"]
    assert "raise" in rows["tests.recalculate_invoice"]
    assert "all arguments (item, seconds)" in rows["tests.unique_sleep"]
    assert "DebouncedJob" in rows["tests.debounce_slow"]
    # debounce_for, not rounded
    assert '<td class="seconds">0.5\xa0s</td>' in rows["tests.debounce_slow"]
    assert ('<td class="seconds">1\xa0s</td>\n        <td class="seconds">3\xa0s</td>'
            in rows["tests.debounce_record"])
    assert "debounce_id()" in rows["tests.rebuild_index"]


def test_debounced_jobs_lists_a_pending_burst(listed_store: str) -> None:
    """A1: a pending burst shows job, debounce id, dispatches in the burst, first/last
    dispatch, runs at, max-wait deadline and the latest arguments, escaped."""
    from tests import jobs_debounce

    for value in (1, 2, "<script>alert(1)</script>"):
        jobs_debounce.debounce_record.delay(7, value)
    jobs_debounce.debounce_record.delay(8, 0)
    client = login("viewer", "view_joblock")
    html = client.get(DEBOUNCES).content.decode().replace("<wbr>", "")
    row = re.search(
        r"<th class=\"field-job\">tests.debounce_record</th>\s*"
        r"<td class=\"ident\"[^>]*>item=7</td>(.*?)</tr>",
        html,
        re.S,
    )
    assert row is not None, html
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[0] == "3"  # dispatches in this burst
    assert "none" not in cells[4]  # max_wait=3.0: a deadline is shown
    assert cells[5] == "(7, &#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27;)"
    assert "<script>alert(1)" not in html
    found = client.get(DEBOUNCES + "?q=ITEM%3D8").content.decode()
    assert "item=8" in found and "item=7" not in found
    assert "2 pending debounces" in client.get(DEBOUNCES).content.decode()


def test_show_args_false_hides_debounce_arguments(listed_store: str) -> None:
    """A1: DEDUP_JOBS["SHOW_ARGS"] = False hides the latest arguments."""
    from tests import jobs_debounce

    jobs_debounce.debounce_record.delay(9, "secret-value")
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "SHOW_ARGS": False}):
        html = login("viewer", "view_joblock").get(DEBOUNCES).content.decode()
    assert "item=9" in html
    assert "secret-value" not in html
    assert "hidden (SHOW_ARGS = False)" in html


@pytest.mark.django_db
def test_job_classes_show_every_kind_and_its_limits() -> None:
    """A1, T1-T3: Job classes names a ThrottledJob's kind and shows each job's limits in
    the concurrency and throttle columns ("—" for a job with none)."""
    html = login("viewer", "view_joblock").get(CLASSES).content.decode().replace("<wbr>", "")
    rows = {
        m.group(1): re.findall(r"<td[^>]*>(.*?)</td>", m.group(2), re.S)
        for m in re.finditer(r"<th[^>]* title=\"[^\"]*\">([^<]+)</th>(.*?)</tr>", html, re.S)
    }
    assert rows["tests.two_at_once"][0] == "ThrottledJob"
    assert rows["tests.two_at_once"][-2:] == ["2", "—"]
    assert rows["tests.five_per_second"][-2:] == ["—", "5/s"]
    assert rows["tests.unique_one_at_once"][0] == "UniqueJob"
    assert rows["tests.unique_one_at_once"][-2:] == ["1", "—"]  # a UniqueJob's limit
    assert rows["tests.unique_sleep"][-2:] == ["—", "—"]


@pytest.mark.django_db
def test_the_store_label_names_the_model_of_the_page() -> None:
    """A1: the database store is labelled with the model each page lists."""
    client = login("viewer", "view_joblock")
    for url, model in ((LOCKS, "JobLock"), (DEBOUNCES, "PendingDebounce"),
                       ("/admin/dedup_jobs/throttlekey/", "ThrottleKey")):
        html = client.get(url, {"store": "database"}).content.decode()
        assert f"<strong>database ({model} model)</strong>" in html, url


def test_names_break_between_their_words() -> None:
    """A1 layout: a task name may break after '.', ':' and '_' (a <wbr>), escaped; only a
    word longer than any real one (24 characters) also breaks inside, every 12."""
    from dedup_jobs.templatetags.dedup_admin import breakable, breakable_class

    assert breakable("shop.tasks:rebuild_index.") == "shop.<wbr>tasks:<wbr>rebuild_<wbr>index."
    assert breakable("<b>.x") == "&lt;b&gt;.<wbr>x"
    assert breakable("tests.long_name_" + "x" * 30) == (
        "tests.<wbr>long_<wbr>name_<wbr>" + "x" * 12 + "<wbr>" + "x" * 12 + "<wbr>" + "x" * 6)
    assert breakable("recalculate_customer_invoice_totals") == (
        "recalculate_<wbr>customer_<wbr>invoice_<wbr>totals")  # real words stay whole
    assert breakable_class("UniqueUntilProcessingJob") == "Unique<wbr>Until<wbr>Processing<wbr>Job"
