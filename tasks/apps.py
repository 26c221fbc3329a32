from django.apps import AppConfig


class BatchingConfig(AppConfig):
    name = "dynamic_batching"
    #: Distinctive: a host project's own app is often called `tasks`.
    label = "dynamic_batching"
    verbose_name = "Batching"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .edge import task  # noqa: F401 - registers batching.infer with every Celery app
