"""OpenAI request bodies -> the router's GenerateRequest."""

import time
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class StreamDeadline:
    """A backstop for a stream that makes progress too slowly to ever end
    (the router's stall timeout catches one that makes none): the class's
    allowance for queueing and prefill plus a generous time per output
    token. Only a request that bounds its output gets one."""

    interactive_s: float
    batch_s: float
    per_output_token_s: float

    def unix_s(self, service_class: int, max_output_tokens: int | None, now_unix_s: float) -> float:
        if not max_output_tokens:
            return 0.0  # none: the router's stall timeout still applies
        allowance_s = self.batch_s if service_class == common_pb2.SERVICE_CLASS_BATCH else self.interactive_s
        return now_unix_s + allowance_s + max_output_tokens * self.per_output_token_s


def generate_request(
    body: ChatCompletionRequest | CompletionRequest, tenant: Tenant, request_id: str, default_max_tokens: int,
    deadline: StreamDeadline | None = None, affinity_key: str = "",
) -> router_pb2.GenerateRequest:
    service_class = SERVICE_TIERS[body.service_tier]
    request = router_pb2.GenerateRequest(
        request_id=request_id,
        tenant=tenant.name,
        model=body.model,
        sampling=sampling_params(body),
        max_output_tokens=body.output_limit() or default_max_tokens,
        service_class=service_class,
        critical=tenant.critical,
        degradable=tenant.degradable,
        allow_fallback=tenant.allow_fallback,
        affinity_key=affinity_key,
    )
    if deadline is not None:
        request.deadline_unix_s = deadline.unix_s(service_class, body.output_limit(), time.time())
    if isinstance(body, ChatCompletionRequest):
        request.chat.messages.extend(
            router_pb2.ChatMessage(role=ROLE_ALIASES.get(m.role, m.role), content=m.text(), name=m.name or "") for m in body.messages
        )
    else:
        request.prompt_text = body.prompt
    return request
