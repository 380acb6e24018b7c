"""The entity model's own admin, with the queue's filters and actions (``QueueAdminMixin``)."""

from django.contrib import admin

from django_delayq.admin import QueueAdminMixin
from tests.testapp.models import Shipment


@admin.register(Shipment)
class ShipmentAdmin(QueueAdminMixin, admin.ModelAdmin):
    list_display = ("reference", "priority")
    search_fields = ("reference",)
