from django.urls import path
from shop import views

urlpatterns = [
    path("orders/", views.place_order),
    path("orders/<int:order_id>/", views.show_order),
    path("receipts/<str:result_id>/", views.show_receipt),
]
