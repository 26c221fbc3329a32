"""`celery -A tasks.collector.worker worker ...`: a Celery worker that runs the collector.

The project's app, with the collector's start-up step added in this process only.
"""

from ..protocol.app import get_app
from .step import CollectorStep

app = get_app()
app.steps["worker"].add(CollectorStep)
