"""Faults injected between a client and Redis: a TCP proxy that can lose the reply to a
command after Redis ran it, as a connection cut at the wrong moment does.

The proxy forwards every byte both ways. Armed with `lose_reply_to(marker)`, it lets the
next command whose bytes hold `marker` through to Redis, then closes both sockets
instead of relaying the reply: the client sees a lost connection for a command that
took effect, which is exactly what a retrying client then runs a second time.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class LosingProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        #: How many replies it has lost, and the last one (as far as it read it).
        self.lost = 0
        self.swallowed = b""
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def lose_reply_to(self, marker: bytes) -> None:
        """Lose the reply to the next command that holds `marker`, once."""
        with self._lock:
            self._marker = marker

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            cut = threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, cut), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                with self._lock:
                    armed = self._marker is not None and self._marker in data
                    if armed:
                        self._marker = None
                if armed:
                    # Redis gets the command; the reply never reaches the client.
                    cut.set()
                    server.sendall(data)
                    self.swallowed = _wait_for_reply(server)
                    self.lost += 1
                    break
                server.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, server):
                _close(s)

    def _downstream(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        try:
            while not cut.is_set():
                data = server.recv(65536)
                if not data or cut.is_set():
                    break
                client.sendall(data)
        except OSError:
            pass


def _wait_for_reply(server: socket.socket) -> bytes:
    """Until Redis has answered the command (so it ran), without relaying the answer:
    the downstream thread stops relaying once `cut` is set, and this read takes it."""
    server.settimeout(1)
    with suppress(OSError):
        return server.recv(65536)
    return b""


def _close(s: socket.socket) -> None:
    with suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


@contextmanager
def losing_proxy(redis_url: str) -> Iterator[LosingProxy]:
    from urllib.parse import urlsplit

    parts = urlsplit(redis_url)
    proxy = LosingProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    try:
        yield proxy
    finally:
        proxy.close()
