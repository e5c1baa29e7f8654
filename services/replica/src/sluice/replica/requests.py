"""TokenRequest (protobuf) -> EngineRequest, validated at the edge."""

import time

import grpc

from sluice.engine.request import EngineRequest, ServiceClass, StopPolicy
from sluice.model.config import LlamaConfig
from sluice.model.sampler import SamplingParams
from sluice.rpc.errors import ServiceError
from sluice.v1 import common_pb2, replica_pb2

SERVICE_CLASSES = {
    common_pb2.SERVICE_CLASS_UNSPECIFIED: ServiceClass.INTERACTIVE,
    common_pb2.SERVICE_CLASS_INTERACTIVE: ServiceClass.INTERACTIVE,
    common_pb2.SERVICE_CLASS_BATCH: ServiceClass.BATCH,
}


def _invalid(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "invalid_request", message)


def engine_request(request: replica_pb2.TokenRequest, config: LlamaConfig) -> EngineRequest:
    prompt = tuple(request.prompt_token_ids)
    if not prompt:
        raise _invalid("prompt_token_ids must not be empty")
    if max(prompt) >= config.vocab_size:
        raise _invalid(f"prompt token id {max(prompt)} is outside the vocabulary ({config.vocab_size})")
    if request.max_output_tokens < 1:
        raise _invalid("max_output_tokens must be >= 1")
    if len(prompt) + request.max_output_tokens > config.max_position_embeddings:
        raise _invalid(
            f"{len(prompt)} prompt + {request.max_output_tokens} output tokens exceed the context "
            f"of {config.max_position_embeddings}"
        )
    s = request.sampling
    try:
        sampling = SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p if 0 < s.top_p <= 1 else 1.0,
            top_k=s.top_k,
            seed=s.seed if s.HasField("seed") else None,
            min_tokens=min(s.min_tokens, request.max_output_tokens),
            ignore_eos=s.ignore_eos,
            stop_token_ids=tuple(s.stop_token_ids),
            max_tokens=request.max_output_tokens,
        )
    except ValueError as error:
        raise _invalid(str(error)) from error
    return EngineRequest(
        request_id=request.request_id,
        prompt_token_ids=prompt,
        stop=StopPolicy(
            max_output_tokens=request.max_output_tokens,
            eos_token_ids=frozenset(config.eos_token_ids),
            stop_token_ids=frozenset(s.stop_token_ids),
            ignore_eos=s.ignore_eos,
            min_tokens=sampling.min_tokens,
        ),
        service_class=SERVICE_CLASSES.get(request.service_class, ServiceClass.INTERACTIVE),
        fairness_key=request.fairness_key,
        cache_salt=request.cache_salt,
        sampling=sampling,
        arrival_s=time.monotonic(),
    )
