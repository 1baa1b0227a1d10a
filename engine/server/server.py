"""The API server on its own thread (uvicorn, its own event loop), over an engine it does not own:
``lanes serve``'s, or the window's, so that API requests and the window's chats share rounds.

    server = ApiServer(engine, host="127.0.0.1", port=8080)
    server.start()        # binds (a port in use is a LanesError naming it) and serves
    print(server.url)     # http://127.0.0.1:8080/v1
    server.stop()         # closes connections and joins the thread

Off loopback it refuses to start without an API key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import uvicorn

from engine.errors import LanesError
from engine.rounds.engine_thread import Engine
from engine.server.app import ApiService, ServerOptions, make_app

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiServer:
    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 options: ServerOptions | None = None, aliases: Sequence[str] = (),
                 on_change: Callable[[int], None] | None = None) -> None:
        self.engine, self.host, self.port = engine, host, port
        self.options = options or ServerOptions()
        self.aliases, self.on_change = aliases, on_change
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.service: ApiService | None = None
        if not is_loopback(host) and not self.options.api_key:
            raise LanesError(f"serving on {host} makes the model reachable from other machines: "
                             "give an API key (--api-key or LANES_API_KEY) to do that")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> int:
        """Requests running or queued now."""
        return self.service.running if self.service is not None else 0

    def start(self, timeout: float = 60.0) -> None:
        """Wait for the engine's model, bind and serve; returns once requests are answered."""
        info = self.engine.info()
        tokenizer = self.engine.run_sync(lambda sched: sched.tokenizer, timeout=timeout)
        self.service = ApiService(self.engine, info, tokenizer, self.options, self.aliases, self.on_change)
        sock = self._bind()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(make_app(self.service), log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2, lifespan="off")
        self._server = uvicorn.Server(config)
        # Tokenizing and saving run off the event loop on one worker, started here and joined with the loop.
        pool = ThreadPoolExecutor(1, thread_name_prefix="lanes-api-work")
        pool.submit(lambda: None).result()
        self._thread = threading.Thread(target=self._serve, args=(sock, pool), name="lanes-api", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise LanesError(f"the API server on {self.url} stopped while starting (see the log)")
            self._thread.join(0.02)

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise LanesError(f"cannot serve on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        sock.set_inheritable(True)
        return sock

    def _serve(self, sock: socket.socket, pool: ThreadPoolExecutor) -> None:
        server = self._server
        assert server is not None

        async def serve() -> None:
            asyncio.get_running_loop().set_default_executor(pool)
            await server.serve(sockets=[sock])

        try:
            asyncio.run(serve())
        except Exception:
            log.exception("the API server stopped")
        finally:
            pool.shutdown()
            sock.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop answering (streams still running are cancelled) and join the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._server = self._thread = None

    def wait(self) -> None:
        """Block until the server stops (``lanes serve``: until Ctrl+C)."""
        if self._thread is not None:
            self._thread.join()
