"""A1 layout: at 1280 and 1920 px every page of the app's admin section shows every column of
its table: the table scrolls inside its own box (as Django's changelists do) and never runs
under the filter sidebar or off the page, and an owner task id stays on one line. Measured
from the element boxes in headless Chromium, not judged from a screenshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock
from dedup_jobs.keys import build_key
from dedup_jobs.stores import get_store
from tests import jobs
from tests.admin_helpers import fill
from tests.test_admin_browser import browser, log_in, shots  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.redis, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAGES = ("joblock", "pendingdebounce", "jobclass", "overview")

#: the boxes the assertions need, read in the page
MEASURE = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
  const results = document.querySelector('#changelist .results');
  const filter = document.querySelector('#changelist-filter');
  const heads = [...document.querySelectorAll('#result_list thead th')];
  const owners = [...document.querySelectorAll('#result_list td.owner')].map(td => {
    const range = document.createRange(); range.selectNodeContents(td);
    const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
    return [td.innerText, lines.size];
  });
  const out = {
    viewport: window.innerWidth,
    page: document.documentElement.scrollWidth,
    results: results ? box(results) : null,
    overflow: results ? getComputedStyle(results).overflowX : null,
    filter: filter ? box(filter) : null,
    heads: heads.map(th => [th.innerText.trim(), ...box(th)]),
    owners: owners,
  };
  if (results) { results.scrollLeft = results.scrollWidth; }
  out.lastAfterScroll = heads.length ? box(heads[heads.length - 1]) : null;
  return out;
}"""


def crowd(app: Any) -> None:
    """Rows with long ids, arguments and owners on every page."""
    long_id = "customer=" + "x" * 120
    for n in range(3):
        jobs.unique_sleep.delay(f"{long_id}-{n}")
    jobs.unique_add.delay(7, b=3)
    app.tasks["tests.recalculate_invoice"].delay(4411, note="late fee " * 12)
    fill("redis", 4, task="tests.until_processing", ttl=3600)
    store = get_store("redis")
    running = build_key("unique", "tests.unique_retry", "item=3,fail_times=1")
    owner = "6f1c0f2e-5d1b-4b2a-9a53-0c6f8d1e2a77"
    store.acquire(running, owner, 60, now=clock.now() - 40)
    store.start(running, owner, 60, now=clock.now(), release=False)
    from tests import jobs_debounce

    for value in range(3):
        jobs_debounce.debounce_record.delay(12, "payload " * 30 + str(value))
    app.tasks["tests.rebuild_index"].delay(501, reason="a long reason " * 10)


@pytest.mark.parametrize("width", [1280, 1920])
def test_no_column_hidden_or_cut(
    app: Any, browser: Any, live_server: Any, width: int, shots: Path,  # noqa: F811
) -> None:
    """A1: at ``width`` px no page of the section hides or cuts a column: the page itself
    never scrolls sideways, the table's box ends left of the filter sidebar, and a table wider
    than its box scrolls inside it until its last column is in view; owner ids on one line."""
    crowd(app)
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        log_in(page, live_server, "/admin/dedup_jobs/joblock/")
        for name in PAGES:
            response = page.goto(f"{live_server.url}/admin/dedup_jobs/{name}/")
            assert response is not None and response.status == 200, name
            got = page.evaluate(MEASURE)
            page.screenshot(path=str(shots / f"layout-{name}-{width}.png"), full_page=True)
            where = f"{name} at {width}px: {got}"
            assert got["page"] <= got["viewport"], f"the page scrolls sideways: {where}"
            if got["results"] is None:
                continue
            right = got["results"][1]
            if got["filter"] is not None:
                assert right <= got["filter"][0] + 1, f"the table runs under the filter: {where}"
            cut = [h for h in got["heads"] if h[2] > right + 1]
            if cut:
                assert got["overflow"] in ("auto", "scroll"), f"columns cut off: {cut}; {where}"
                assert got["lastAfterScroll"][1] <= right + 1, f"last column unreachable: {where}"
            wrapped = [owner for owner, lines in got["owners"] if lines > 1]
            assert not wrapped, f"owner ids wrap: {wrapped}; {where}"
    finally:
        context.close()


def test_overview_in_the_browser(browser: Any, live_server: Any, shots: Path) -> None:  # noqa: F811
    """A5: after 20 dispatches of 4 keys (flushed), the Overview in Chromium draws both charts
    and its job row says 16 duplicates prevented, 4 dispatched (screenshot for the docs)."""
    from dedup_jobs.metrics import history, tally

    tally.take()
    for n in range(20):
        jobs.unique_sleep.delay(f"overview-{n % 4}")
    assert history.flusher.flush()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        # as a deployment runs it (the suite's own processes keep no flush thread)
        with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "METRICS_FLUSH_SECONDS": 30}):
            log_in(page, live_server, "/admin/dedup_jobs/overview/")
        charts = page.locator("figure.dedup-chart svg")
        assert charts.count() == 2 and charts.first.is_visible()
        assert charts.first.bounding_box()["height"] > 50
        row = page.locator("tr.job-row", has_text="tests.unique_sleep")
        assert row.locator("td.prevented").inner_text() == "16"
        assert row.locator("td.dispatched").inner_text() == "4"
        page.screenshot(path=str(shots / "admin-overview.png"), full_page=True)
    finally:
        context.close()
