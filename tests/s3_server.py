"""A real S3 endpoint for tests: moto's standalone server on 127.0.0.1 on a free port.

Talks HTTP like AWS S3, so s3fs/botocore run their real code paths (signing, multipart, error
translation); only the storage behind the endpoint is in memory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

CREDENTIALS = {"key": "testing", "secret": "testing"}


@contextlib.contextmanager
def s3_server(traffic: Traffic | None = None) -> Iterator[str]:
    """Start moto's threaded server, yield its endpoint URL, stop it at exit.

    With `traffic`, every request passes through it first: it counts what the server sees
    (requests, the peak number in flight, GETs per object) and may answer 503 SlowDown
    instead of the server, as a throttled S3 prefix does."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log on stderr

    # botocore must not pick up real credentials or a proxy for the loopback endpoint.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", CREDENTIALS["key"])
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", CREDENTIALS["secret"])
    os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1"]))

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            from moto.moto_server.werkzeug_app import (
                DomainDispatcherApplication,
                MotoRequestHandler,
                create_backend_app,
            )
            from werkzeug.serving import make_server

            app: Any = DomainDispatcherApplication(create_backend_app)
            if traffic is not None:
                app = traffic.wrap(app)
            self._server = make_server(
                self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    server = Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>tg</RequestId></Error>"
)


class Traffic:
    """What an S3 endpoint sees, and the throttling it answers with (a WSGI middleware).

    - `fail_every`: answer 503 SlowDown to every n-th object request (no query string: not a
      listing) whose method is in `fail_methods` (deterministic: the same count every run);
    - `capacity`: answer 503 SlowDown while more than this many requests are in flight (how
      S3 throttles a hot prefix);
    - `hold_s`: keep every request in flight this long (a slow store), so overlap is visible.
    Counters: `requests`, `peak` (most in flight at once), `slowdowns` (503s sent),
    `gets` ({object path: GETs of its body})."""

    def __init__(
        self,
        fail_every: int = 0,
        fail_methods: tuple[str, ...] = ("PUT", "GET"),
        capacity: int = 0,
        hold_s: float = 0.0,
    ) -> None:
        import threading

        self.fail_every, self.fail_methods = fail_every, fail_methods
        self.capacity, self.hold_s = capacity, hold_s
        self.requests = self.peak = self.slowdowns = self._inflight = self._eligible = 0
        self.gets: dict[str, int] = {}
        self.slowed: list[str] = []
        """'METHOD path' of every request answered 503, in order (failure messages)."""
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.requests = self.peak = self.slowdowns = self._eligible = 0
            self.gets = {}
            self.slowed = []

    def wrap(self, app: Any) -> Any:
        import time

        def middleware(environ: dict, start_response: Any) -> Any:
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            with self._lock:
                self.requests += 1
                self._inflight += 1
                self.peak = max(self.peak, self._inflight)
                throttled = 0 < self.capacity < self._inflight
                plain_object = not environ.get("QUERY_STRING")  # not a listing or multipart
                if method in self.fail_methods and self.fail_every and plain_object:
                    self._eligible += 1
                    throttled = throttled or self._eligible % self.fail_every == 0
                if throttled:
                    self.slowdowns += 1
                    self.slowed.append(f"{method} {path}")
                elif method == "GET" and plain_object:
                    self.gets[path] = self.gets.get(path, 0) + 1
            try:
                if self.hold_s:
                    time.sleep(self.hold_s)
                if throttled:
                    length = int(environ.get("CONTENT_LENGTH") or 0)
                    if length:  # read the body, so the connection stays usable
                        environ["wsgi.input"].read(length)
                    start_response(
                        "503 Slow Down",
                        [
                            ("Content-Type", "application/xml"),
                            ("Content-Length", str(len(_SLOW_DOWN))),
                        ],
                    )
                    return [_SLOW_DOWN]
                return app(environ, start_response)
            finally:
                with self._lock:
                    self._inflight -= 1

        return middleware


def storage_options(endpoint: str) -> dict[str, Any]:
    """s3fs options for the test endpoint. fsspec caches one instance per option set, so stores
    share a client (connection pool) as they would in a training process."""
    return {
        **CREDENTIALS,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "use_listings_cache": False,
    }


def make_bucket(endpoint: str, bucket: str) -> Any:
    """Create `bucket` and return an s3fs filesystem for the endpoint."""
    import s3fs

    fs = s3fs.S3FileSystem(**storage_options(endpoint))
    fs.call_s3("create_bucket", Bucket=bucket)  # us-east-1: no LocationConstraint
    return fs
