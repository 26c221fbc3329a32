"""Django project: settings, URLs, and the Celery app every process shares."""
