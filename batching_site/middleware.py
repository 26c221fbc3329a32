"""The site's own middleware runs sync or async, as the chain around it does: under
ASGI (batching_site/asgi.py) a request for an async view then passes through with no
switch to a thread and back, and no thread held while the view waits."""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest


class SyncOrAsync:
    """Call `follow(get_response)` in `__init__`; write `_call` (sync) and `_acall`."""

    sync_capable = True
    async_capable = True

    def follow(self, get_response: Any) -> None:
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        return self._acall(request) if self._async else self._call(request)

    def _call(self, request: HttpRequest) -> Any:
        raise NotImplementedError

    async def _acall(self, request: HttpRequest) -> Any:
        raise NotImplementedError
