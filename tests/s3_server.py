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
def s3_server() -> Iterator[str]:
    """Start moto's threaded server, yield its endpoint URL, stop it at exit."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log on stderr

    # botocore must not pick up real credentials or a proxy for the loopback endpoint.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", CREDENTIALS["key"])
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", CREDENTIALS["secret"])
    os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1"]))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


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
