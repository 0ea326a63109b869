"""The one small trio HTTP/1.1 layer that the boundary, the stubs and the fault proxy share.

server.py: `serve(handler)` under a nursery, on h11 (protocol.py: h11-mypyc when
it is installed). client.py: `UpstreamPool` for one origin and
`open_upstream_stream`, the only function that opens an outbound connection; its
requests and responses go through wire.py (llhttp, via httptools: ADR 0008). Both
move their bytes through sockio.StreamIO.
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
from docket.http.server import Listening, serve
from docket.http.server_connection import ServerConfig
from docket.http.server_errors import (
    BadRequest,
    BodyTooLarge,
    ClientGone,
    RequestError,
    RequestTimeout,
)
from docket.http.server_exchange import Request, Responder

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
