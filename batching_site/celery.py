"""The Celery app: configuration only, as any Django project that adds batching writes
it. The queues and routes come from the package (tasks/protocol/app.py `configure`);
each worker role adds its own start-up step where it starts (tasks/collector/worker.py,
gpu_workers/worker.py).
"""

import os

from celery import Celery

from tasks.protocol.app import configure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

app = Celery("batching_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
configure(app)
