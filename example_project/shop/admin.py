from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import ngettext

from example_project.shop.models import Invoice, Order, Product, StockSync
from example_project.shop.tasks import recalculate_invoice, update_search_index


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("name", "sku", "price", "indexed_at", "index_runs", "reprice_runs")
    search_fields = ("name", "sku")
    readonly_fields = ("search_document", "indexed_at", "index_runs", "reprice_runs")
    actions = ("reindex",)

    def save_model(self, request: HttpRequest, obj: Product, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        update_search_index.delay_on_commit(obj.pk)

    @admin.action(description="Re-index in search")
    def reindex(self, request: HttpRequest, queryset: QuerySet[Product]) -> None:
        queued = sum(
            not update_search_index.delay(pk).deduplicated
            for pk in queryset.values_list("pk", flat=True)
        )
        self.message_user(
            request,
            ngettext(
                "%(n)d product queued for re-indexing (others were already queued).",
                "%(n)d products queued for re-indexing (others were already queued).",
                queued,
            )
            % {"n": queued},
            messages.SUCCESS,
        )


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = (
        "pk",
        "customer_email",
        "product",
        "quantity",
        "created_at",
        "confirmations_sent",
    )
    list_select_related = ("product",)


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("number", "order", "total", "recalculated_at", "recalculations")
    actions = ("recalculate",)

    @admin.action(description="Recalculate totals")
    def recalculate(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            recalculate_invoice.delay(pk, reason="admin")
        self.message_user(request, "Recalculation queued.", messages.SUCCESS)


@admin.register(StockSync)
class StockSyncAdmin(admin.ModelAdmin):
    """The runs of sync_stock (without_overlapping): their intervals never overlap."""

    list_display = ("warehouse", "trigger", "started_at", "finished_at")
    list_filter = ("warehouse",)
