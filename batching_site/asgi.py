"""The site as an ASGI application (its gunicorn worker class: batching_site/web_worker.py).

Why uvicorn workers under gunicorn (not daphne): gunicorn stays the process manager it
was under WSGI (worker restarts, --timeout, graceful shutdown, the same command line and
--forwarded-allow-ips), and each worker runs one uvicorn event loop. Async views (a
request's status with `?wait=`, tasks/web/api.py) wait on their answers as coroutines
on that loop. Daphne would bring Twisted for WebSockets the site does not have.

The sync parts of a request (Django's middleware, the session and token lookups, the
sync views) run on threads. Django's own ASGI handler makes a new thread for every
request, and so a new database connection and a new Celery result backend with its own
Redis pool for every request: measured, submits through the site ran at 0.55x of the
threaded WSGI workers. Here each request's sync parts run instead on one of WEB_THREADS
long-lived threads (the one with the fewest requests in progress), with asgiref's own
ThreadSensitiveContext(executor=...): what lives per thread lives on, as under the
threaded workers, while a waiting request holds no thread at all.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction
from asgiref.wsgi import WsgiToAsgi
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
from django.urls import Resolver404, resolve

from batching_site.logins import LockedAddressGate

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")


class OnLongLivedThreads:
    """An ASGI app whose requests' sync parts run on `threads` long-lived threads."""

    def __init__(self, app: Any, threads: int) -> None:
        self.app = app
        self._executors = [ThreadPoolExecutor(1, thread_name_prefix=f"web-{i}") for i in range(threads)]
        self._in_progress = [0] * threads

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        i = min(range(len(self._executors)), key=self._in_progress.__getitem__)
        self._in_progress[i] += 1
        try:
            # Django's handler opens a context of its own inside; the outer one wins.
            async with ThreadSensitiveContext(executor=self._executors[i]):
                await self.app(scope, receive, send)
        finally:
            self._in_progress[i] -= 1


class ByView:
    """Each request to the Django handler its view wants: an async view (a long poll)
    to Django's ASGI handler, so that it waits on the event loop; any other to Django's
    WSGI handler on one thread, once, as the threaded workers ran it. Under the ASGI
    handler a sync request crosses between the loop and its thread at each middleware
    and back (a dozen crossings, each a wait for the GIL on a busy machine): measured,
    submits ran at 0.55x of the threaded workers that way."""

    def __init__(self) -> None:
        self.asgi = get_asgi_application()
        self.wsgi = WsgiToAsgi(get_wsgi_application())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        handler = self.asgi if scope["type"] == "http" and _is_async(scope["path"]) else self.wsgi
        await handler(scope, receive, send)


def _is_async(path: str) -> bool:
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return iscoroutinefunction(match.func)


# Logins from an address already refused are answered before any of it (logins.py).
application = LockedAddressGate(OnLongLivedThreads(ByView(), settings.WEB_THREADS))
