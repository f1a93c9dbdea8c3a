"""The shop's background jobs, one of each kind dedup_jobs offers.

- ``update_search_index``: decorator style ``UniqueJob``. Saving a product in the admin, a
  bulk import and a price feed can all ask for the same re-index at once; one copy queued or
  running is enough, because it reads the product's latest state when it runs.
- ``RecalculateInvoice``: class style ``UniqueJob`` with its own ``unique_id()``: the key is
  the invoice, whatever the ``reason`` argument says.
- ``send_order_confirmation``: ``UniqueUntilProcessingJob``. Double clicks while the email
  is queued collapse into one; once the worker has started on it, a new request (say the
  customer changed the order) is queued again rather than lost.
- ``rebuild_product_feed``: ``DebouncedJob``. Every product edit asks for its category's
  feed to be rebuilt; only the last request of a burst runs, a second after the edits stop
  (and within 5 seconds of the first, however long the editing goes on).
- ``reprice_product``: ``UniqueJob`` with ``on_duplicate = "replace"``. A price feed sends a
  product's price several times before the worker gets to it; only the latest price matters,
  so a new dispatch replaces the queued one (which is revoked and never runs).
- ``sync_stock``: ``UniqueUntilProcessingJob`` with ``without_overlapping = True``. Two syncs
  of one warehouse must never run at once, and a trigger that arrives during a sync must not be
  lost: it waits for the running sync and runs after it (one running, at most one queued).
- ``sync_supplier_stock``: ``ThrottledJob``. Each supplier's stock API allows 2 calls per
  second; every product page view may ask for a refresh. The calls of one supplier start at
  most 2 per second across every worker (the excess waits, re-published, never dropped);
  another supplier is not held back.
- ``ExportReport``: ``ThrottledJob`` whose limit depends on the call (L1). A "free" account's
  exports run one at a time; a "vip" account has no limit (``concurrency()`` returns None),
  so its exports run side by side.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from celery import shared_task
from django.core.mail import send_mail
from django.db.models import F
from django.utils import timezone

from dedup_jobs import DebouncedJob, ThrottledJob, UniqueJob, UniqueUntilProcessingJob
from example_project.celery import app
from example_project.shop.models import Invoice, Order, Product, ProductFeed, StockSync

#: Stand-ins for the slow part of each job: a search engine call, an SMTP round trip.
INDEXING_SECONDS = 1.0
SENDING_SECONDS = 0.3
SYNCING_SECONDS = 1.0


@shared_task(base=UniqueJob, unique_for=3600)
def update_search_index(product_id: int) -> str:
    """Rebuild one product's search document."""
    product = Product.objects.get(pk=product_id)
    document = f"{product.sku} {product.name} {product.description}".strip().lower()
    time.sleep(INDEXING_SECONDS)
    Product.objects.filter(pk=product_id).update(
        search_document=document, indexed_at=timezone.now(), index_runs=F("index_runs") + 1
    )
    return f"indexed product {product_id}"


class RecalculateInvoice(UniqueJob):
    """Recompute an invoice's total from its order."""

    name = "shop.recalculate_invoice"
    unique_for = 600

    def unique_id(self, invoice_id: int, **kwargs: Any) -> str:
        return str(invoice_id)

    def run(self, invoice_id: int, reason: str = "") -> str:
        invoice = Invoice.objects.select_related("order__product").get(pk=invoice_id)
        total = invoice.order.product.price * invoice.order.quantity
        Invoice.objects.filter(pk=invoice_id).update(
            total=total.quantize(Decimal("0.01")),
            recalculated_at=timezone.now(),
            recalculations=F("recalculations") + 1,
        )
        return f"invoice {invoice.number}: {total}"


recalculate_invoice = app.register_task(RecalculateInvoice())


@shared_task(base=UniqueUntilProcessingJob, unique_for=600)
def send_order_confirmation(order_id: int) -> str:
    """Email the customer the current state of their order."""
    order = Order.objects.select_related("product").get(pk=order_id)
    time.sleep(SENDING_SECONDS)
    send_mail(
        subject=f"Your order #{order.pk}",
        message=f"Thank you! {order.quantity} x {order.product.name} is on its way.",
        from_email=None,
        recipient_list=[order.customer_email],
    )
    Order.objects.filter(pk=order_id).update(confirmations_sent=F("confirmations_sent") + 1)
    return f"confirmation sent for order #{order_id}"


@shared_task(base=DebouncedJob, debounce_for=1, max_wait=5, debounce_on=("category",))
def rebuild_product_feed(category: str, edit: int = 0) -> str:
    """Regenerate a category's feed once a burst of product edits has settled. ``edit`` is the
    edit that asked for it: the run gets the last one."""
    feed, _ = ProductFeed.objects.get_or_create(category=category)
    ProductFeed.objects.filter(pk=feed.pk).update(
        rebuilt_at=timezone.now(), rebuilds=F("rebuilds") + 1, last_edit=edit
    )
    return f"feed {category!r} rebuilt at edit {edit}"


@shared_task(base=UniqueJob, unique_for=600, unique_on=("product_id",), on_duplicate="replace")
def reprice_product(product_id: int, price: str) -> str:
    """Apply a price from the feed; a later price replaces a queued one (the latest wins)."""
    Product.objects.filter(pk=product_id).update(
        price=Decimal(price), reprice_runs=F("reprice_runs") + 1
    )
    return f"product {product_id} repriced to {price}"


@shared_task(
    base=UniqueUntilProcessingJob, unique_for=600, unique_on=("warehouse",),
    without_overlapping=True,
)
def sync_stock(warehouse: str, trigger: int = 0) -> str:
    """Pull a warehouse's stock levels; never two syncs of one warehouse at once."""
    started = timezone.now()
    time.sleep(SYNCING_SECONDS)
    StockSync.objects.create(
        warehouse=warehouse, trigger=trigger, started_at=started, finished_at=timezone.now()
    )
    return f"stock of {warehouse!r} synced (trigger {trigger})"
@shared_task(base=ThrottledJob, throttle="2/s", throttle_on=("supplier",))
def sync_supplier_stock(supplier: str, sku: str = "") -> str:
    """Ask one supplier's stock API about one article (2 calls per second per supplier)."""
    return f"{supplier}: stock of {sku or 'everything'} synced"


class ExportReport(ThrottledJob):
    """Export an account's report: one at a time on the "free" plan, no limit on "vip"."""

    name = "shop.export_report"
    throttle_on = ("account",)

    def concurrency(self, account: str, plan: str, n: int = 0) -> int | None:
        return None if plan == "vip" else 1

    def run(self, account: str, plan: str, n: int = 0) -> tuple[float, float]:
        started = time.time()
        time.sleep(0.6)  # the export's work
        return started, time.time()


export_report = app.register_task(ExportReport())
