"""The flow-control columns of the admin in a real browser (headless Chromium, Playwright) at
1400x900: on *Held locks* and *Job classes* every new cell is inside the viewport and the
results box, and none cuts its text (SPEC A1 with R1-R3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dedup_jobs import clock
from dedup_jobs.stores import get_store
from dedup_jobs.stores.base import running_key
from tests import jobs, jobs_flow
from tests.test_admin_browser import browser, log_in  # noqa: F401 - the browser fixture

pytestmark = [pytest.mark.redis, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1400, 900

#: the boxes of the cells of one column, of the page and of the results container
MEASURE = """(selector) => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {x: r.x, right: r.right, width: r.width, height: r.height,
            scroll: el.scrollWidth, client: el.clientWidth, text: el.innerText}; };
  const results = document.querySelector('#changelist .results');
  return {cells: [...document.querySelectorAll(selector)].map(box),
          results: box(results),
          page: {scroll: document.documentElement.scrollWidth,
                 client: document.documentElement.clientWidth}};
}"""


@pytest.fixture
def narrow(browser: Any, live_server: Any) -> Iterator[Any]:  # noqa: F811 - the fixture
    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    yield tab
    context.close()


def measure(page: Any, selector: str) -> dict[str, Any]:
    boxes: dict[str, Any] = page.evaluate(MEASURE, selector)
    assert boxes["cells"], f"no cell matches {selector}"
    return boxes


def assert_all_shown(boxes: dict[str, Any]) -> None:
    results, page = boxes["results"], boxes["page"]
    assert page["scroll"] <= page["client"], boxes  # no horizontal scroll of the page
    assert results["scroll"] <= results["client"] + 1, boxes  # nor of the results
    for cell in boxes["cells"]:
        assert cell["width"] > 0 and cell["height"] > 0, cell
        assert cell["x"] >= 0 and cell["right"] <= min(WIDTH, results["right"]) + 1, cell
        assert cell["scroll"] <= cell["client"] + 1, cell  # its text is not cut


def assert_columns_shown(page: Any, *selectors: str) -> None:
    """Each selector's cells fully shown; their boxes are printed (pytest -s) for the record."""
    for selector in selectors:
        boxes = measure(page, selector)
        print(selector, [(round(c["x"]), round(c["right"]), c["text"]) for c in boxes["cells"]],
              "results right", round(boxes["results"]["right"]))
        assert_all_shown(boxes)


def test_flow_columns_fit_at_1400_pixels(app: Any, narrow: Any, live_server: Any) -> None:
    """A1, R1-R3: at 1400x900 the flow-control badges of Held locks (under the job name),
    the run marker label beside the state and the page's last column, and the on_duplicate
    and Flow control columns of Job classes are fully shown: inside the viewport and the
    results box, text not cut, no horizontal scroll of the page or the results."""
    jobs.unique_sleep.delay("a fairly long argument to widen the unique id column " * 2)
    jobs_flow.replace_latest.delay(3, value=1)
    jobs_flow.observed.delay(4)
    store = get_store("redis")
    key = jobs_flow.no_overlap.job_key((5,), {})
    now = clock.now()
    assert store.acquire(key, "6f1c0f2e-5d1b-4b2a-9a53-0c6f8d1e2a77", 60, now=now).acquired
    assert store.start_exclusive(key, running_key(key), "6f1c0f2e-5d1b-4b2a-9a53-0c6f8d1e2a77",
                                 60, now=now).run
    jobs_flow.no_overlap.delay(5)
    log_in(narrow, live_server, "/admin/dedup_jobs/joblock/")
    assert narrow.locator("#result_list tbody tr").count() == 5
    assert narrow.locator(".run-marker").count() == 1
    assert_columns_shown(narrow, "#result_list th.field-job", "#result_list .flow-badge",
                         "#result_list .run-marker", "#result_list tbody td:last-child")
    assert narrow.locator(".flow-badge", has_text="no overlap").count() == 2
    narrow.goto(f"{live_server.url}/admin/dedup_jobs/jobclass/")
    assert_columns_shown(narrow, "#result_list thead th", "#result_list td.on-duplicate",
                         "#result_list td.flow", "#result_list td.flow div")
    assert narrow.get_by_text("replace", exact=True).first.is_visible()
