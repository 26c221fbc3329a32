"""WhiteNoise for a site whose async views run under ASGI (batching_site/asgi.py).
WhiteNoise's middleware is sync only: in front of an async view, Django would run it on
a thread that then blocks for the whole request, a long poll's wait included. This one
asks whether a request is for a static file on the event loop, and only serves the file
on a thread."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from whitenoise.middleware import WhiteNoiseMiddleware

from .middleware import SyncOrAsync


class StaticFiles(SyncOrAsync, WhiteNoiseMiddleware):
    def __init__(self, get_response: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(get_response, *args, **kwargs)
        self.follow(get_response)

    def _call(self, request: HttpRequest) -> Any:
        return WhiteNoiseMiddleware.__call__(self, request)

    async def _acall(self, request: HttpRequest) -> Any:
        path = request.path_info
        static_file = self.find_file(path) if self.autorefresh else self.files.get(path)
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(self.serve)(static_file, request)
