"""The exceptions a handler of docket.http.server meets (server.py re-exports them).

ClientGone: the client left mid-exchange, raised from `send` and from body reads.
RequestError and its kinds: a request the server itself refuses; left uncaught
by the handler, the server answers its status and closes the connection. They
sit apart from server.py so that the connection (server_connection.py) and the
Request and Responder (server_exchange.py) can raise them without importing the
server.
"""

from __future__ import annotations


class ClientGone(Exception):
    """The client closed or reset the connection, or stopped reading, mid-exchange."""


class RequestError(Exception):
    """A request the server itself refuses; raised from body reads. Uncaught, the
    server answers `status` with the message and closes the connection."""

    status = 400
    reason = "Bad Request"
    code = "bad_request"  # names the fault in an answer an application shapes (error_shape)


class BadRequest(RequestError):
    """The request's framing is malformed (a bad chunk, a body cut short)."""

    code = "bad_framing"


class RequestTimeout(RequestError):
    """No bytes of a request under way arrived within the request timeout."""

    status = 408
    reason = "Request Timeout"
    code = "request_timeout"


class HeadTimeout(RequestTimeout):
    """A request head (request line and headers) not complete within its total deadline."""


class BodyTooLarge(RequestError):
    """The request body is larger than the handler's limit."""

    status = 413
    reason = "Content Too Large"
    code = "body_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit
