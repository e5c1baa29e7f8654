"""The one place an unexpected exception becomes an answer.

Anything a route did not turn into an ApiError ends here: the client gets a
500 in OpenAI's error shape naming a request id (also in `x-request-id`),
and the log gets one line with that id, the method, the path and the
traceback, never the request body (a traceback holds no local values). The
exception is not re-raised, so the server does not log it a second time.
A response that already started cannot change its status: the error is
logged and the connection closes, as it would have.
"""

import logging
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.gateway.errors import INTERNAL_MESSAGE, ApiError
from sluice.outcomes import Reason

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"


class CatchAll:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("unexpected error, request id %s, %s %s", request_id, scope.get("method"),
                          scope.get("path"))
            if started:
                return
            error = ApiError(500, f"{INTERNAL_MESSAGE} Request id {request_id}.", Reason.INTERNAL_ERROR.value,
                             headers={REQUEST_ID_HEADER: request_id})
            await error.response()(scope, receive, send)
