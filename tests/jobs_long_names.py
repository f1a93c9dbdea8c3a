"""Jobs with the long dotted names of a real project, for the admin's layout tests
(tests/test_admin_fit.py) and the docs' screenshots (tests/admin_screenshots.py): one of each
kind, with limits, so every admin page has long names and every column a value."""

from __future__ import annotations

from celery import shared_task

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob

BILLING = "example_project.shop.billing.tasks.recalculate_customer_invoice_totals"
SEARCH = "example_project.catalogue.search.tasks.rebuild_product_search_index"
PAYMENTS = "example_project.integrations.payments.tasks.sync_payment_provider_webhooks"


@shared_task(base=UniqueJob, name=BILLING, unique_for=900, unique_on=("customer_id",),
             on_duplicate="replace", concurrency=4)
def recalculate_customer_invoice_totals(customer_id: str, reason: str = "") -> str:
    return customer_id


@shared_task(base=DebouncedJob, name=SEARCH, debounce_for=30, max_wait=300,
             debounce_on=("category",))
def rebuild_product_search_index(category: str, changed: str = "") -> str:
    return category


@shared_task(base=ThrottledJob, name=PAYMENTS, concurrency=2, throttle="10/s",
             throttle_on=("merchant_id",))
def sync_payment_provider_webhooks(merchant_id: str, page: int = 0) -> str:
    return merchant_id
