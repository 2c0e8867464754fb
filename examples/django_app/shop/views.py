import json

from django.conf import settings
from django.db import transaction
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shop.models import Order
from shop.tasks import confirm_order


class PaymentDeclined(Exception):
    pass


def charge(order: Order) -> None:
    if order.quantity > 100:
        raise PaymentDeclined(f"{order.quantity} x {order.item} is over the card's limit")


@csrf_exempt
@require_POST
def place_order(request):
    data = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(item=data["item"], quantity=int(data["quantity"]))
            job = confirm_order.delay(order.id)  # jobqueue, in this transaction
            receipt = enqueue_receipt(order)  # Django's task API, in this transaction too
            charge(order)  # may raise: then the order and its jobs vanish
    except PaymentDeclined as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"id": order.id, "job": job.id, "receipt": receipt}, status=201)


def enqueue_receipt(order: Order) -> str | None:
    """The id of the order's receipt, enqueued (None where Django's task API is not installed)."""
    if not settings.SHOP_RECEIPTS:
        return None
    from shop.receipts import send_receipt

    return send_receipt.enqueue(order.id).id


@require_GET
def show_order(request, order_id):
    try:
        order = Order.objects.get(pk=order_id)
    except Order.DoesNotExist:
        raise Http404("no such order") from None
    return JsonResponse(
        {
            "id": order.id,
            "item": order.item,
            "quantity": order.quantity,
            "status": order.status,
            "confirmation": order.confirmation,
        }
    )


@require_GET
def show_receipt(request, result_id):
    if not settings.SHOP_RECEIPTS:
        raise Http404("this shop sends no receipts: Django's task API is not installed")
    from shop.receipts import TaskResultDoesNotExist, send_receipt

    try:
        result = send_receipt.get_result(result_id)
    except TaskResultDoesNotExist:
        raise Http404("no such receipt") from None
    body = {"id": result.id, "status": result.status, "attempts": result.attempts}
    if result.is_finished and result.status == "SUCCESSFUL":
        body["receipt"] = result.return_value
    return JsonResponse(body)
