"""The shop's background work: one jobqueue task and one written for Django's task API."""

from __future__ import annotations

try:
    from django.tasks import task  # Django 6.0+
except ImportError:
    from django_tasks import task  # the backport, on Django 5.2

from jobqueue import JobQueue
from shop.models import Order

app = JobQueue()  # no URL: the Django database named by settings.JOBQUEUE (default: "default")


@app.task(name="shop.confirm_order")
def confirm_order(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    order.status = "confirmed"
    order.confirmation = f"CONF-{order_id:06d}"
    order.save(update_fields=["status", "confirmation"])
    return order.confirmation


@task()
def send_receipt(order_id: int) -> dict[str, object]:
    """A Django task (django.tasks API) that jobqueue workers run through JobQueueBackend."""
    order = Order.objects.get(pk=order_id)
    return {"order": order.id, "text": f"Thank you for buying {order.quantity} x {order.item}."}
