"""A1/A5 layout: every page of the app's admin section (Overview, Held locks, Debounced jobs,
Throttles, Job classes and the release confirmation) fits a laptop's screen and a desktop's:
at 1280x800 and 1920x1080, with Django's nav sidebar open (its default) and closed, in the
light and the dark colour scheme, on pages filled with the long dotted names of a real
project. Measured from the element boxes in headless Chromium:

- no table is wider than its box, and the page never scrolls sideways;
- no table runs under the filter panel;
- a job name breaks only after a '.', ':' or '_' (never inside a word), and an owner task id or a
  duration ("14 min 59 s") is never broken over two lines.

With ``DEDUP_JOBS_SCREENSHOTS`` set, each page is also saved as a PNG of the viewport
(``python -m tests.admin_screenshots`` makes the docs' images that way)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from dedup_jobs import clock, metrics
from dedup_jobs.keys import build_key
from dedup_jobs.metrics import history, tally
from dedup_jobs.metrics.tally import Taken
from dedup_jobs.stores import get_store
from tests import jobs
from tests import jobs_long_names as named
from tests.test_admin_browser import browser, log_in, shots  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.redis, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NAMES = (named.BILLING, named.SEARCH, named.PAYMENTS)
OWNER = "6f1c0f2e-5d1b-4b2a-9a53-0c6f8d1e2a77"
#: (file name, URL under /admin/dedup_jobs/)
PAGES = (
    ("overview", "overview/"),
    ("held-locks", "joblock/"),
    ("debounced-jobs", "pendingdebounce/"),
    ("throttles", "throttlekey/"),
    ("job-classes", "jobclass/"),
)
SIZES = {1280: 800, 1920: 1080}

#: everything the assertions need, read in the page
MEASURE = r"""(names) => {
  const rect = e => e.getBoundingClientRect();
  const problems = [];
  const tables = [];
  const columns = [];
  const filter = document.querySelector('#changelist-filter');
  const fbox = filter ? rect(filter) : null;
  document.querySelectorAll('#content table').forEach((table, n) => {
    const box = table.parentElement;
    const t = rect(table), b = rect(box);
    const style = getComputedStyle(box);
    const inner = b.width - parseFloat(style.borderLeftWidth) - parseFloat(style.borderRightWidth)
      - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const label = (table.id || table.className || 'table') + '#' + n;
    tables.push([label, Math.round(t.width), Math.round(inner)]);
    columns.push([label, [...table.querySelectorAll('thead th')].map(
      th => [th.innerText.trim().replace(/\s+/g, ' '), Math.round(rect(th).width)])]);
    if (t.width > inner + 1) {
      problems.push(
        `table ${label} is ${Math.round(t.width)} px wide in a ${Math.round(inner)} px box`);
    }
    if (fbox && fbox.width && t.right > fbox.left + 1 && t.left < fbox.right - 1
        && t.bottom > fbox.top && t.top < fbox.bottom) {
      problems.push(`table ${label} runs under the filter panel`);
    }
  });
  const page = document.documentElement.scrollWidth;
  if (page > window.innerWidth) {
    problems.push(`the page scrolls sideways: ${page} px in a ${window.innerWidth} px window`);
  }
  // Line breaks inside the text nodes of the tables: a piece of a job name breaks only
  // after '.', ':' or '_' (between its words); a task id (a UUID) or a duration never breaks.
  const lineOf = (node, i) => {
    const range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);
    const rects = range.getClientRects();
    return rects.length ? Math.round(rects[0].top) : null;
  };
  const unbroken = [/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g,
                    /\b\d+ (?:d|h|min|s)(?: \d+ (?:h|min|s))?\b/g];
  const walker = document.createTreeWalker(document.querySelector('#content'),
                                           NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.data;
    if (!text.trim() || !node.parentElement.closest('table')) continue;
    if (names.some(name => name.includes(text.trim()))) {
      let previous = null;
      for (let i = 0; i < text.length; i++) {
        const line = lineOf(node, i);
        if (line === null) continue;
        if (previous !== null && line > previous.line + 2 && !'.:_ '.includes(previous.ch)
            && text[i] !== ' ') {
          problems.push(`a job name breaks inside a word: "${text.slice(0, i)}|${text.slice(i)}"`);
        }
        previous = {line: line, ch: text[i]};
      }
    }
    for (const pattern of unbroken) {
      for (const found of text.matchAll(pattern)) {
        const first = lineOf(node, found.index);
        const last = lineOf(node, found.index + found[0].length - 1);
        if (first !== null && last !== null && last > first + 2) {
          problems.push(`"${found[0]}" is broken over two lines`);
        }
      }
    }
  }
  // The text of an owner cell (a task id, shortened or whole) or a no-wrap cell never
  // wraps (a cell may hold two lines of its own: a time, <br>, "in 26 s").
  document.querySelectorAll('#content td.owner, #content .nowrap').forEach(cell => {
    const texts = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = texts.nextNode(); node; node = texts.nextNode()) {
      if (!node.data.trim()) continue;
      const range = document.createRange(); range.selectNodeContents(node);
      const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (lines.size > 1) problems.push(`"${node.data}" wraps over ${lines.size} lines`);
    }
  });
  return {problems: problems, tables: tables, columns: columns, page: page};
}"""


def fill(app: Any) -> None:
    """Every page with rows of long names: locks (one running), debounces, throttle keys,
    the Overview's history over the last day with a burst in the last minutes."""
    tally.take()
    store = get_store("redis")
    now = clock.now()
    for n, customer in enumerate(("acme-corporation-eu-west-1", "globex:tenant:eu:invoices",
                                  "initech.billing.quarterly-statements")):
        named.recalculate_customer_invoice_totals.delay(f"{customer}-{n}", reason="price")
    running = build_key("unique", named.BILLING, "customer_id='umbrella-health-services-ltd'")
    store.acquire(running, OWNER, 900, now=now - 40)
    store.start(running, OWNER, 900, now=now, release=False)
    for n in range(4):
        named.rebuild_product_search_index.delay(
            f"garden-furniture:outdoor-dining-sets-{n % 2}", changed="price,stock,images " * 3)
    for merchant, owners in (("merchant=acme-payments-europe", "abc"), ("merchant=globex", "x")):
        key = build_key("throttle", named.PAYMENTS, merchant)
        for owner in owners:
            store.throttle_admit(key, owner, delivery=f"d-{owner}", concurrency=2,
                                 rate_limit=10, rate_period=1.0, lease=60)
    history_of_a_day(now)


def history_of_a_day(now: float) -> None:
    """Decisions spread over the last day, and a burst in the last two minutes (flushed)."""
    day = Taken()  # a working day, busier in the afternoon, until two hours ago
    for n in range(3 * 20):
        at = int(now - 22 * 3600 + n * 1200)
        scale = 1 + (n * 7) % 5 + (6 if 30 <= n <= 48 else 0)  # every 20 minutes
        for job, outcome, count in ((named.BILLING, "dispatched", 4),
                                    (named.BILLING, "deduplicated", 9),
                                    (named.SEARCH, "superseded", 5),
                                    (named.SEARCH, "dispatched", 1),
                                    (named.PAYMENTS, "dispatched", 7),
                                    (named.PAYMENTS, "ran", 7)):
            day.timed[(job, outcome, at)] += count * scale
            day.decisions[(job, outcome)] += count * scale
    for seconds_ago in range(100, 10, -10):  # a burst over the last two minutes
        at = int((now - seconds_ago) // 10 * 10)
        deduplicated, deferred = 10 + (7 * seconds_ago) % 50, 5 + (3 * seconds_ago) % 40
        day.timed[(named.BILLING, "deduplicated", at)] += deduplicated
        day.timed[(named.PAYMENTS, "deferred", at)] += deferred
        day.decisions[(named.BILLING, "deduplicated")] += deduplicated
        day.decisions[(named.PAYMENTS, "deferred")] += deferred
    history.write(day, now)
    key = build_key("unique", named.BILLING, "customer_id='acme-corporation-eu-west-1'").key
    throttle = build_key("throttle", named.PAYMENTS, "merchant=acme-payments-europe").key
    for _ in range(40):
        metrics.decision(named.BILLING, "dispatched")
        metrics.decision(named.BILLING, "deduplicated", key)
        metrics.decision(named.BILLING, "ran")
    for _ in range(3):
        metrics.decision(named.BILLING, "replaced", key)
        metrics.decision(named.BILLING, "skipped", key)
        metrics.decision(named.BILLING, "lock_lost")
        metrics.decision(named.BILLING, "store_error")
    for _ in range(150):
        metrics.decision(named.PAYMENTS, "dispatched")
        metrics.decision(named.PAYMENTS, "deferred", throttle)
        metrics.decision(named.PAYMENTS, "ran")
    for _ in range(30):
        metrics.decision(named.SEARCH, "superseded", "dedup:debounce:" + named.SEARCH)
    metrics.decision(named.SEARCH, "dispatched")
    assert history.flusher.flush()


def confirmation(page: Any) -> None:
    """Held locks → tick every lock → Release selected locks → the confirmation page."""
    page.locator("#action-toggle").check()
    page.select_option("select[name=action]", "release_selected")
    page.click("button[name=index]")
    page.wait_for_selector("text=Are you sure you want to release")


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("sidebar", ["open", "closed"])
@pytest.mark.parametrize("width", [1280, 1920])
def test_every_page_fits(
    app: Any, browser: Any, live_server: Any,  # noqa: F811
    width: int, sidebar: str, scheme: str,
) -> None:
    """A1/A5: at ``width`` px, nav sidebar ``sidebar``, ``scheme`` colours, no table of any
    page of the section is wider than its box or under the filter panel, the page does not
    scroll sideways, and names, task ids and durations break only where they may."""
    fill(app)
    folder = os.environ.get("DEDUP_JOBS_SCREENSHOTS")
    context = browser.new_context(viewport={"width": width, "height": SIZES[width]},
                                  color_scheme=scheme)
    is_open = "true" if sidebar == "open" else "false"
    context.add_init_script(f"localStorage.setItem('django.admin.navSidebarIsOpen', '{is_open}')")
    page = context.new_page()
    page.set_default_timeout(15_000)
    found: dict[str, Any] = {}

    def look(name: str) -> None:
        got = page.evaluate(MEASURE, list(NAMES))
        found[name] = got
        if folder and sidebar == "open":
            target = Path(folder)
            target.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(target / f"{name}-{width}-{scheme}.png"))

    try:
        with override_settings(DEDUP_JOBS={**settings.DEDUP_JOBS, "METRICS_FLUSH_SECONDS": 30}):
            log_in(page, live_server, "/admin/dedup_jobs/overview/")
            open_now = page.evaluate(
                "() => document.querySelector('#main').classList.contains('shifted')")
            assert open_now == (sidebar == "open")
            for name, url in PAGES:
                response = page.goto(f"{live_server.url}/admin/dedup_jobs/{url}")
                assert response is not None and response.status == 200, name
                assert page.locator("#result_list tbody tr").count() > 0, name
                look(name)
            page.goto(f"{live_server.url}/admin/dedup_jobs/joblock/")
            confirmation(page)
            look("release-confirmation")
    finally:
        context.close()
    print({name: got["tables"] for name, got in found.items()})
    if os.environ.get("DEDUP_JOBS_FIT_COLUMNS"):
        print({name: got["columns"] for name, got in found.items()})
    problems = [f"{name}: {p}" for name, got in found.items() for p in got["problems"]]
    assert not problems, (f"at {width}x{SIZES[width]}, sidebar {sidebar}, {scheme}:\n"
                          + "\n".join(problems))


def test_overview_in_the_browser(
    browser: Any, live_server: Any, shots: Path,  # noqa: F811
) -> None:
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
