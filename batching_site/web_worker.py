"""The gunicorn worker class of the web role (batching_site/processes.py::web_command):
uvicorn's, serving batching_site/asgi.py. Apart from the ASGI application so that
gunicorn's master, which imports the class, does not set up Django."""

import signal

from uvicorn_worker import UvicornWorker

from dynamic_batching.core.lifetime import die_with_parent


class Worker(UvicornWorker):
    """uvicorn in a gunicorn worker, with gunicorn's --worker-connections as the most
    requests one worker serves at once (uvicorn's limit_concurrency): past it, 503 at
    once, rather than a thread for each sync request of a flood."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.config.limit_concurrency = self.cfg.worker_connections

    def init_process(self) -> None:
        # A worker outlives a master killed with SIGKILL (uvicorn's loop never looks at
        # its parent, as gthread's does), and keeps the port: every master started
        # after it failed to bind and exited. So each worker asks the kernel for SIGTERM
        # when its master dies, and stops as uvicorn stops: no new connections, the
        # requests in progress finished.
        die_with_parent(signal.SIGTERM)
        super().init_process()
