"""Batching's serving surface, for a host project to include under a prefix of its own::

    path("batching/", include("dynamic_batching.urls")),

The JSON API (schema at api/v1/openapi.json), each request's status and timeline, the
health check with per-model readiness, Prometheus metrics (a staff session, or a staff
user's API token as the scrape token), the submit page and the dashboard. Every route
in one flat list. URL names start with `batching-` (`{% url 'batching-healthz' %}`), and
the API's namespace is `batching-api-v1`: no namespace of our own around them, because
django-ninja reverses its docs and schema views by its own namespace alone.
Who may call what: docs/security.md.
"""

from django.urls import path

from .web import dashboard, views
from .web.api import api

urlpatterns = [
    path("", views.index, name="batching-index"),
    path("healthz", views.healthz, name="batching-healthz"),
    path("submit", views.submit_form, name="batching-submit"),
    path("requests/<uuid:request_id>.json", views.request_status, name="batching-request-status"),
    path("requests/<uuid:request_id>", dashboard.request_detail, name="batching-request-detail"),
    path("dashboard/", dashboard.dashboard, name="batching-dashboard"),
    path("metrics", dashboard.prometheus_metrics, name="batching-metrics"),
    path("api/v1/", api.urls),
]
