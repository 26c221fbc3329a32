"""The Celery app, found through the `BATCHING_CELERY_APP` setting.

The batching package never imports the project's Celery module: the project imports
the package, as Django resolves ROOT_URLCONF by name. A Django project that adds
batching points the setting at its own app.
"""

from __future__ import annotations

import os
import threading

from celery import Celery
from django.utils.module_loading import import_string

_app: Celery | None = None
_lock = threading.Lock()


def get_app() -> Celery:
    """The project's Celery app, imported by dotted path on first use."""
    global _app
    if _app is None:
        with _lock:
            if _app is None:
                # Scripts in this repository may skip DJANGO_SETTINGS_MODULE; another
                # project's processes have their own set already.
                os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
                from django.conf import settings

                _app = import_string(settings.BATCHING_CELERY_APP)
    return _app
