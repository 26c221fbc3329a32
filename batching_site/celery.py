"""The Celery app, as any Django project that adds batching writes it: its own
configuration, then `configure(app)`, which marks it as the app batching sends through
and changes none of it. Batching's workers set what their consumers need in their own
processes (dynamic_batching.protocol.app.configure_worker).
"""

import os

from celery import Celery

from dynamic_batching.protocol.app import configure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

app = Celery("batching_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
configure(app)
