"""Every route in one flat list."""

from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="index"),
    path("healthz", views.healthz, name="healthz"),
    path("submit", views.submit_form, name="submit"),
    path("requests/<uuid:request_id>.json", views.request_status, name="request-status"),
    path("admin/", admin.site.urls),
]
