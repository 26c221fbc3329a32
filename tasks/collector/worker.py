"""`celery -A dynamic_batching.collector.worker worker ...`: a Celery worker that runs the collector.

The project's app, with the collector's start-up step added in this process only.
"""

from ..protocol.app import configure_worker, get_app
from .step import CollectorStep

# This process consumes batching's queues alone: their settings apply here only.
app = configure_worker(get_app())
app.steps["worker"].add(CollectorStep)
