"""The one small trio + h11 HTTP layer that the boundary, the stubs and the fault proxy share.

server.py: `serve(handler)` under a nursery; client.py: `UpstreamPool` for one
origin and `open_upstream_stream`, the only function that opens an outbound
connection. Both move their bytes through sockio.StreamIO and take h11 from
protocol.py (h11-mypyc when it is installed).
"""

from docket.http.client import (
    ConnectError,
    ConnectionReset,
    ConnectTimeout,
    Origin,
    PoolTimeout,
    ProtocolError,
    ReadTimeout,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    WriteTimeout,
    open_upstream_stream,
)
from docket.http.server import (
    BadRequest,
    BodyTooLarge,
    ClientGone,
    Listening,
    Request,
    RequestError,
    RequestTimeout,
    Responder,
    ServerConfig,
    serve,
)

__all__ = [
    "BadRequest",
    "BodyTooLarge",
    "ClientGone",
    "ConnectError",
    "ConnectTimeout",
    "ConnectionReset",
    "Listening",
    "Origin",
    "PoolTimeout",
    "ProtocolError",
    "ReadTimeout",
    "Request",
    "RequestError",
    "RequestTimeout",
    "Responder",
    "ServerConfig",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "WriteTimeout",
    "open_upstream_stream",
    "serve",
]
