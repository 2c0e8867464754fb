from django.contrib import admin
from django.urls import path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place_order),
    path("orders/<int:order_id>/", views.show_order),
    path("receipts/<str:result_id>/", views.show_receipt),
]
