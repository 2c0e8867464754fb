"""The shop's background work: a jobqueue task, and the receipts written for Django's task API."""

from __future__ import annotations

from django.conf import settings

from jobqueue import JobQueue
from shop.models import Order

app = JobQueue()  # no URL: the Django database named by settings.JOBQUEUE (default: "default")

if settings.SHOP_RECEIPTS:
    from shop.receipts import send_receipt  # noqa: F401 -- a worker knows the Django tasks of tasks modules


@app.task(name="shop.confirm_order")
def confirm_order(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    order.status = "confirmed"
    order.confirmation = f"CONF-{order_id:06d}"
    order.save(update_fields=["status", "confirmation"])
    return order.confirmation
