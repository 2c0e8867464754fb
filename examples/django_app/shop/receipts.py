"""Receipts: a task written for Django's task API, run by jobqueue workers through JobQueueBackend.

Imported only where that API is installed (``settings.SHOP_RECEIPTS``); ``shop.tasks`` imports it,
so that workers, which import the ``tasks`` module of every app, know the task.
"""

from __future__ import annotations

try:
    from django.tasks import task  # Django 6.0+
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:
    from django_tasks import task  # the backport, on Django 5.2
    from django_tasks.exceptions import TaskResultDoesNotExist

from shop.models import Order

__all__ = ["TaskResultDoesNotExist", "send_receipt"]


@task()
def send_receipt(order_id: int) -> dict[str, object]:
    """A Django task (django.tasks API) that jobqueue workers run through JobQueueBackend."""
    order = Order.objects.get(pk=order_id)
    return {"order": order.id, "text": f"Thank you for buying {order.quantity} x {order.item}."}
