"""A deliberately small shop: products, orders and their invoices."""

from __future__ import annotations

from decimal import Decimal

from django.db import models


class Product(models.Model):
    sku = models.CharField("SKU", max_length=32, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    price = models.DecimalField(max_digits=10, decimal_places=2)
    # Written by the update_search_index job.
    search_document = models.TextField(blank=True, editable=False)
    indexed_at = models.DateTimeField(null=True, blank=True, editable=False)
    index_runs = models.PositiveIntegerField(default=0, editable=False)
    # Written by the reprice_product job.
    reprice_runs = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return f"{self.name} ({self.sku})"


class Order(models.Model):
    customer_email = models.EmailField()
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    # Written by the send_order_confirmation job.
    confirmations_sent = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ("-created_at",)

    def __str__(self) -> str:
        return f"Order #{self.pk} ({self.quantity} x {self.product.sku})"


class Invoice(models.Model):
    number = models.CharField(max_length=32, unique=True)
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="invoice")
    # Written by the RecalculateInvoice job.
    total = models.DecimalField(max_digits=12, decimal_places=2, default=Decimal("0.00"))
    recalculated_at = models.DateTimeField(null=True, blank=True, editable=False)
    recalculations = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ("number",)

    def __str__(self) -> str:
        return self.number


class ProductFeed(models.Model):
    """The product feed of one category, as shopping sites fetch it."""

    category = models.CharField(max_length=64, unique=True)
    # Written by the rebuild_product_feed job.
    rebuilt_at = models.DateTimeField(null=True, blank=True, editable=False)
    rebuilds = models.PositiveIntegerField(default=0, editable=False)
    last_edit = models.PositiveIntegerField(default=0, editable=False)

    def __str__(self) -> str:
        return f"{self.category} feed"


class StockSync(models.Model):
    """One run of the sync_stock job: which trigger ran, and when (its interval)."""

    warehouse = models.CharField(max_length=64)
    trigger = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ("started_at",)

    def __str__(self) -> str:
        return f"{self.warehouse} sync for trigger {self.trigger}"
