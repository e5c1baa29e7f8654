"""OpenAI request bodies -> the router's GenerateRequest."""

from sluice.gateway.auth import Tenant
from sluice.gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from sluice.v1 import common_pb2, router_pb2

SERVICE_TIERS = {
    None: common_pb2.SERVICE_CLASS_UNSPECIFIED,
    "auto": common_pb2.SERVICE_CLASS_INTERACTIVE,
    "default": common_pb2.SERVICE_CLASS_INTERACTIVE,
    "flex": common_pb2.SERVICE_CLASS_BATCH,
}

# OpenAI's defaults when a field is omitted.
DEFAULT_TEMPERATURE = 1.0
# OpenAI's newer name for the system role; chat templates know "system".
ROLE_ALIASES = {"developer": "system"}
DEFAULT_TOP_P = 1.0


def sampling_params(body: SamplingFields) -> common_pb2.SamplingParams:
    params = common_pb2.SamplingParams(
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=DEFAULT_TOP_P if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),
        stop=body.stop_list(),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
    )
    if body.seed is not None:
        params.seed = body.seed % (1 << 64)
    return params


def generate_request(
    body: ChatCompletionRequest | CompletionRequest, tenant: Tenant, request_id: str, default_max_tokens: int
) -> router_pb2.GenerateRequest:
    request = router_pb2.GenerateRequest(
        request_id=request_id,
        tenant=tenant.name,
        model=body.model,
        sampling=sampling_params(body),
        max_output_tokens=body.output_limit() or default_max_tokens,
        service_class=SERVICE_TIERS[body.service_tier],
    )
    if isinstance(body, ChatCompletionRequest):
        request.chat.messages.extend(
            router_pb2.ChatMessage(role=ROLE_ALIASES.get(m.role, m.role), content=m.text(), name=m.name or "") for m in body.messages
        )
    else:
        request.prompt_text = body.prompt
    return request
