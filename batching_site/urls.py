"""Every route in one flat list."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from .web import dashboard, gate, views
from .web.api import api

urlpatterns = [
    path("", views.index, name="index"),
    path("healthz", views.healthz, name="healthz"),
    path("submit", views.submit_form, name="submit"),
    path("requests/<uuid:request_id>.json", views.request_status, name="request-status"),
    path("requests/<uuid:request_id>", dashboard.request_detail, name="request-detail"),
    path("dashboard/", dashboard.dashboard, name="dashboard"),
    path("metrics", dashboard.prometheus_metrics, name="metrics"),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
    path("auth/staff", gate.staff_gate, name="staff-gate"),
    # Every user's login (the admin's own login form takes staff only).
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="/login/"), name="logout"),
]
