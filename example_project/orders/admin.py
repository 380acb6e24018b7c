from django.contrib import admin

from django_delayq.admin import QueueAdminMixin
from orders.models import Order, Shipment


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer_email", "total", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("customer_email",)
    date_hierarchy = "created_at"


@admin.register(Shipment)
class ShipmentAdmin(QueueAdminMixin, admin.ModelAdmin):
    """The shipments' own changelist, with the queue's filters (status, retrying,
    overdue) and actions (run now, retry, cancel, reschedule) from the mixin."""

    list_display = ("id", "order", "address", "tracking_number")
    search_fields = ("address", "tracking_number")
    list_select_related = ("order",)
