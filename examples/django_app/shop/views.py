import json

from django.db import transaction
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shop.models import Order
from shop.tasks import confirm_order, send_receipt

try:
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:
    from django_tasks.exceptions import TaskResultDoesNotExist


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
            receipt = send_receipt.enqueue(order.id)  # Django's task API, in this transaction too
            charge(order)  # may raise: then the order and both jobs vanish
    except PaymentDeclined as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"id": order.id, "job": job.id, "receipt": receipt.id}, status=201)


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
    try:
        result = send_receipt.get_result(result_id)
    except TaskResultDoesNotExist:
        raise Http404("no such receipt") from None
    body = {"id": result.id, "status": result.status, "attempts": result.attempts}
    if result.is_finished and result.status == "SUCCESSFUL":
        body["receipt"] = result.return_value
    return JsonResponse(body)
