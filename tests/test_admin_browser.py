"""The admin in a real browser (headless Chromium from Debian's packages, driven by
Playwright): log in, see a dispatched job's lock, search, release it through the action and
its confirmation page, and see a ``<script>`` argument shown as text (SPEC A1).

Screenshots of the pages go to ``$DEDUP_JOBS_SCREENSHOTS`` when set, else to the test's
temporary directory (the docs' images in docs/img/admin/ are made by
``python -m tests.admin_screenshots``, through tests/test_admin_fit.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from tests import jobs
from tests.admin_helpers import PASSWORD, fill, make_user

CHROMIUM = os.environ.get("DEDUP_JOBS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [pytest.mark.redis, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _need_chromium() -> None:
    from tests.conftest import REQUIRE

    if shutil.which(CHROMIUM) is None:
        message = f"chromium is not installed at {CHROMIUM} (apt-get install chromium)"
        if REQUIRE:
            pytest.fail(f"{message} and DEDUP_JOBS_REQUIRE_SERVICES=1")
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need_chromium()
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls
    # (creating users) are still plain synchronous code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    tab.dialogs = []
    tab.on("dialog", lambda dialog: (tab.dialogs.append(dialog.message), dialog.dismiss()))
    yield tab
    context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("DEDUP_JOBS_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


def log_in(page: Any, live_server: Any, next_url: str) -> None:
    make_user("operator", "view_joblock", "release_joblock")
    page.goto(f"{live_server.url}/admin/login/?next={next_url}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_url}")


@pytest.mark.parametrize("store", ["redis", "database"])
def test_release_a_dispatched_lock_in_the_browser(
    page: Any, live_server: Any, store: str, shots: Path
) -> None:
    """A1: an operator logs in, sees the lock of a real dispatch, finds it by search,
    releases it through the action's confirmation page and sees it gone; a <script> in job
    arguments shows as text and never runs."""
    with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "STORE": store}):
        xss = jobs.unique_sleep.delay("<script>alert('xss')</script>")
        target = jobs.unique_sleep.delay(42)
        log_in(page, live_server, "/admin/dedup_jobs/joblock/")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 2
        assert page.locator(f"td.owner[title='{target.id}']").is_visible()  # shortened
        shown = page.locator("td.ident", has_text="<script>").inner_text()
        assert shown == "item=\"<script>alert('xss')</script>\",seconds=0.0"
        assert xss.id in page.content()
        page.fill("#searchbar", "item=42")
        page.press("#searchbar", "Enter")
        page.wait_for_url("**q=item%3D42**")
        assert rows.count() == 1 and page.locator(f"td.owner[title='{target.id}']").is_visible()
        rows.first.locator("input.action-select").check()
        page.select_option("select[name=action]", "release_selected")
        page.click("button[name=index]")
        page.wait_for_selector("text=Are you sure you want to release")
        assert page.get_by_text(target.id).is_visible()
        page.click("input[value='Yes, release them']")
        page.wait_for_selector("text=Released 1 lock.")
        assert page.locator("#result_list").count() == 0  # the search now finds nothing
        assert page.get_by_text("No held locks match").is_visible()
        assert jobs.unique_sleep.store().get(jobs.unique_sleep.job_key((42,), {})) is None
        page.click("text=Show all")
        assert rows.count() == 1 and page.locator(f"td.owner[title='{xss.id}']").is_visible()
        assert page.dialogs == []


def test_screenshots_of_the_three_pages(app: Any, page: Any, live_server: Any, shots: Path) -> None:
    """A1: the three pages render for an operator (screenshots for the docs): held locks
    with queued and running locks, debounced jobs, and the job classes."""
    jobs.unique_sleep.delay(1017)
    jobs.unique_add.delay(7, b=3)
    jobs.unique_sleep.delay("<script>alert('x')</script>")
    app.tasks["tests.recalculate_invoice"].delay(4411, note="late fee")
    fill("redis", 4, task="tests.until_processing", ttl=3600)
    store = get_store("redis")
    running = build_key("unique", "tests.unique_retry", "item=3,fail_times=1")
    now = clock.now()
    store.acquire(running, "6f1c0f2e-5d1b-4b2a-9a53-0c6f8d1e2a77", 60, now=now - 40)
    store.start(running, "6f1c0f2e-5d1b-4b2a-9a53-0c6f8d1e2a77", 60, now=now, release=False)
    from tests import jobs_debounce

    for value in range(5):
        jobs_debounce.debounce_record.delay(12, value)
    jobs_debounce.debounce_record.delay(13, "<b>bold?</b>")
    for reason in ("price change", "stock change"):
        app.tasks["tests.rebuild_index"].delay(501, reason=reason)
    log_in(page, live_server, "/admin/dedup_jobs/joblock/")
    assert page.locator("#result_list tbody tr").count() == 9
    assert page.locator(".state-running").count() == 1
    page.screenshot(path=str(shots / "admin-held-locks.png"), full_page=True)
    page.goto(f"{live_server.url}/admin/dedup_jobs/pendingdebounce/")
    assert page.locator("#result_list tbody tr").count() == 3
    assert page.get_by_text("(13, '<b>bold?</b>')").is_visible()
    page.screenshot(path=str(shots / "admin-debounced-jobs.png"), full_page=True)
    page.goto(f"{live_server.url}/admin/dedup_jobs/jobclass/")
    page.screenshot(path=str(shots / "admin-job-classes.png"), full_page=True)
    # polled, not read once: it failed once in CI (a page still rendering?); if it fails
    # again, the message carries what the page showed
    name = page.get_by_text("tests.recalculate_invoice")
    try:
        name.wait_for(state="visible", timeout=10_000)
    except Exception:
        raise AssertionError(page.content()[:3000]) from None
    page.screenshot(path=str(shots / "admin-job-classes.png"), full_page=True)
