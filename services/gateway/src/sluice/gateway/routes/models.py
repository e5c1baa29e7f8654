"""GET /v1/models and GET /v1/models/{model}: the router's catalog."""

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sluice.gateway.auth import authenticate
from sluice.gateway.errors import ApiError, from_service_error
from sluice.gateway.state import GatewayState
from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError
from sluice.v1 import router_pb2


def _model_body(model) -> dict:
    return {"id": model.id, "object": "model", "created": int(model.created_unix_s), "owned_by": "sluice"}


async def _catalog(request: Request) -> router_pb2.ListModelsResponse:
    """Authenticate, then ask the router; refusals raise ApiError."""
    state: GatewayState = request.app.state.gateway
    authenticate(request, state.authenticator)
    try:
        catalog = await state.router.list_models()
    except ServiceError as error:
        raise from_service_error(error) from None
    state.metrics.models.learn(*(model.id for model in catalog.models))
    return catalog


async def list_models(request: Request) -> Response:
    try:
        catalog = await _catalog(request)
    except ApiError as error:
        return error.response()
    return JSONResponse({"object": "list", "data": [_model_body(m) for m in catalog.models]})


async def retrieve_model(request: Request) -> Response:
    name = request.path_params["model"]
    try:
        catalog = await _catalog(request)
    except ApiError as error:
        return error.response()
    for model in catalog.models:
        if model.id == name:
            return JSONResponse(_model_body(model))
    return ApiError.of(Reason.MODEL_NOT_FOUND, f"The model `{name}` does not exist.", param="model").response()
