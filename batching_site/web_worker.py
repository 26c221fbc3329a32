"""The gunicorn worker class of the web role (batching_site/processes.py::web_command):
uvicorn's, serving batching_site/asgi.py. Apart from the ASGI application so that
gunicorn's master, which imports the class, does not set up Django."""

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    """uvicorn in a gunicorn worker, with gunicorn's --worker-connections as the most
    requests one worker serves at once (uvicorn's limit_concurrency): past it, 503 at
    once, rather than a thread for each sync request of a flood."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.config.limit_concurrency = self.cfg.worker_connections
