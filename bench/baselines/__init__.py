"""The systems we compare against: plain Celery and celery-batches, each a minimal
Celery app that a user would write today, run on the same Redis and the same model."""
