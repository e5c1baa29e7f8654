"""One Generate call, start to end.

    resolve version -> tokenize (chat template) -> routing rules -> check context
      -> place via scheduler (which may cap the output or serve the fallback)
      -> Admitted (names the version that serves, and any degradation)
      -> replica tokens -> incremental detokenize -> stop strings -> Delta*
      -> Finished (or Error after the stream started)

The replica request is cancelled whenever this generator stops early: a stop
string matched, the caller (gateway) cancelled us, the replica sent nothing
for the stall timeout, or the request's deadline passed (ProgressWatch).
Every way the scheduler gets the reservation back.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from sluice.router.limits import check_class_prompt_cap, output_budget_tokens
from sluice.router.live_models import LiveModels
from sluice.router.metrics import RouterMetrics
from sluice.router.models import LoadedVersion, ModelRegistry
from sluice.router.placement_client import PlacementClient
from sluice.router.progress_watch import DEFAULT_STALL_TIMEOUT_S, ProgressWatch, StreamTimeout
from sluice.router.replica_channels import ReplicaChannels
from sluice.router.routing_rules import route_for
from sluice.router.cache_scope import CacheScope
from sluice.router.tenant_gate import DEFAULT_PER_TENANT, TenantGate
from sluice.engine.block_hash import BlockHash, extend_block_hashes, root_block_hash
from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError
from sluice.telemetry import spans
from sluice.telemetry.carrier import inject_trace_context, trace_headers
from sluice.tokenization.detokenizer import IncrementalDetokenizer
from sluice.tokenization.stop_strings import StopStringMatcher
from sluice.tokenization.tokenizer import GIL_FREE_ENCODE_MIN_CHARS
from sluice.v1 import common_pb2, replica_pb2, router_pb2, scheduler_pb2

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

UNKNOWN_ALIAS = "unknown"

FINISH_NAMES = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CANCELLED: "cancelled",
    common_pb2.FINISH_REASON_ERROR: "error",
}


def tokenize(version: LoadedVersion, request: router_pb2.GenerateRequest) -> list[int]:
    tokenizer = version.tokenizer
    if request.WhichOneof("input") == "chat":
        messages = [{"role": m.role, "content": m.content} for m in request.chat.messages]
        if not messages:
            raise ServiceError.of(Reason.INVALID_REQUEST, "messages must not be empty")
        try:
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ValueError as error:  # the template rejected the conversation
            raise ServiceError.of(Reason.INVALID_REQUEST, str(error)) from error
    if not request.prompt_text:
        raise ServiceError.of(Reason.INVALID_REQUEST, "prompt must not be empty")
    return tokenizer.encode(request.prompt_text, add_special_tokens=True)


def prompt_block_hashes(prompt_ids: list[int], block_size_tokens: int, cache_salt: str = "") -> list[bytes]:
    """The prompt's full-block prefix hashes in its cache scope, by the
    engine's own function, so the scheduler can match them against what
    replicas report cached."""
    hashes: list[BlockHash] = []
    extend_block_hashes(hashes, prompt_ids, block_size_tokens, root_block_hash(cache_salt))
    return hashes


def _prepare(version: LoadedVersion, request: router_pb2.GenerateRequest, block_size_tokens: int, cache_salt: str):
    prompt_ids = tokenize(version, request)
    return prompt_ids, prompt_block_hashes(prompt_ids, block_size_tokens, cache_salt)


def prompt_chars(request: router_pb2.GenerateRequest) -> int:
    """The characters a request's tokenization reads (the template's own few aside)."""
    if request.WhichOneof("input") == "chat":
        return sum(len(m.content) for m in request.chat.messages)
    return len(request.prompt_text)


# Prompts shorter than this are tokenized on the event loop. Their encode
# holds the GIL throughout (sluice.tokenization.tokenizer), and so does the
# chat template, so a thread would not free the loop for a moment of it;
# the hop there and back (and the tenant gate's turn) would only add its
# own cost: an executor job and a wake-up of the loop a request, beside
# ~0.16 ms to tokenize a 128-token chat (a saving within the whole stack's
# noise, measured).
INLINE_TOKENIZE_MAX_CHARS = GIL_FREE_ENCODE_MIN_CHARS


def affinity_of(request: router_pb2.GenerateRequest) -> str:
    """What the version choice hashes: the tenant's Idempotency-Key, so every
    retry of one request gets the version its first attempt got (keys are
    only unique per tenant, hence the tenant in it); else the attempt id."""
    if request.affinity_key:
        return f"{request.tenant}\0{request.affinity_key}"
    return request.request_id


class Relay:
    def __init__(
        self,
        models: LiveModels | ModelRegistry,  # a plain registry: one catalog for good
        placement: PlacementClient,
        replicas: ReplicaChannels,
        metrics: RouterMetrics,
        placement_timeout_s: float,
        prompt_caps_tokens: dict[int, int] | None = None,
        kv_block_size_tokens: int = 16,
        tokenize_gate: TenantGate | None = None,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        cache_scope: CacheScope | None = None,
    ) -> None:
        self._models = models if isinstance(models, LiveModels) else LiveModels(models)
        self._placement = placement
        self._replicas = replicas
        self._metrics = metrics
        self._placement_timeout_s = placement_timeout_s
        # service class -> prompt cap in tokens (0 = the model's context)
        self._prompt_caps_tokens = prompt_caps_tokens or {}
        self._kv_block_size_tokens = kv_block_size_tokens
        self._tokenize_gate = tokenize_gate or TenantGate(DEFAULT_PER_TENANT)
        self._stall_timeout_s = stall_timeout_s
        self._cache_scope = cache_scope or CacheScope()

    async def generate(self, request: router_pb2.GenerateRequest) -> AsyncIterator[router_pb2.GenerateEvent]:
        """The request's events, inside its `router.generate` span (a child
        of the context the gateway sent with it)."""
        class_name = "batch" if request.service_class == common_pb2.SERVICE_CLASS_BATCH else "interactive"
        # A metric label names a catalog alias, never a string a client sent.
        alias_label = request.model if request.model in self._models.current.aliases else UNKNOWN_ALIAS
        span = tracer.start_span("router.generate", context=spans.request_parent(request.trace_context), attributes={
            spans.REQUEST_ID: request.request_id, spans.MODEL: alias_label, spans.SERVICE_CLASS: class_name,
            spans.TENANT: request.tenant,
        })
        outcome = "cancelled"  # unless the stream says otherwise
        try:
            async for event in self._generate(request, span, class_name, alias_label):
                kind = event.WhichOneof("event")
                if kind == "finished":
                    outcome = FINISH_NAMES.get(event.finished.finish_reason, "error")
                    span.set_attribute(spans.OUTPUT_TOKENS, event.finished.usage.output_tokens)
                elif kind == "error":
                    outcome = event.error.code or "error"
                yield event
        except ServiceError as error:
            outcome = error.info.reason
            raise
        finally:
            spans.end_with_outcome(span, outcome, failed=outcome not in ("stop", "length", "cancelled"))

    async def _generate(
        self, request: router_pb2.GenerateRequest, span: Span, class_name: str, alias_label: str,
    ) -> AsyncIterator[router_pb2.GenerateEvent]:
        alias = request.model
        here = spans.child_context(span)
        try:
            # This request's registry from here to its end, whatever reloads
            # happen meanwhile (live_models).
            resolved = self._models.resolve(alias, affinity_of(request), remember=bool(request.affinity_key))
            models, version = resolved.registry, resolved.version
            asked_version = version.spec.version  # the alias's own choice, before any route or fallback
            # Tokenizing and hashing a long prompt take milliseconds: keep the
            # loop free, and one tenant's burst out of the others' way. A
            # short one costs less than the hop to a thread.
            with tracer.start_as_current_span("router.tokenize", context=here) as tokenize_span:
                salt = self._cache_scope.salt_for(request.tenant)
                if prompt_chars(request) < INLINE_TOKENIZE_MAX_CHARS:
                    prompt_ids, block_hashes = _prepare(version, request, self._kv_block_size_tokens, salt)
                else:
                    async with self._tokenize_gate.hold(request.tenant, request.service_class):
                        prompt_ids, block_hashes = await asyncio.to_thread(
                            _prepare, version, request, self._kv_block_size_tokens, salt)
                tokenize_span.set_attribute(spans.PROMPT_TOKENS, len(prompt_ids))
            span.set_attribute(spans.PROMPT_TOKENS, len(prompt_ids))
            routed_to = route_for(models.aliases[alias].routes, len(prompt_ids), request.max_output_tokens,
                                  class_name, request.tenant)
            if routed_to is not None:
                version = models.version(routed_to)  # same tokenizer: the ids stand
            check_class_prompt_cap(len(prompt_ids), self._prompt_caps_tokens.get(request.service_class, 0), class_name)
            max_output = output_budget_tokens(
                len(prompt_ids), request.max_output_tokens, version.context_length_tokens
            )
            enqueue = scheduler_pb2.Enqueue(
                request_id=request.request_id,
                tenant=request.tenant,
                model_version=version.spec.version,
                service_class=request.service_class,
                prompt_tokens=len(prompt_ids),
                max_output_tokens=version.context_length_tokens - len(prompt_ids),
                requested_output_tokens=request.max_output_tokens,
                deadline_unix_s=request.deadline_unix_s,
                prompt_block_hashes=block_hashes,
                block_size_tokens=self._kv_block_size_tokens,
                critical=request.critical,
                degradable=request.degradable,
                fallback_model_version=version.spec.fallback if request.allow_fallback else "",
            )
            # Admission is the wait for the scheduler's answer: its queue
            # wait and placement are child spans of this one.
            with tracer.start_as_current_span("router.admission", context=here) as admission_span:
                inject_trace_context(enqueue.trace_context, spans.child_context(admission_span))
                dispatch = await self._placement.place(enqueue, self._placement_timeout_s)
                admission_span.set_attribute(spans.REPLICA, dispatch.replica_id)
        except ServiceError as error:
            self._metrics.rejections_total.labels(error.info.reason).inc()
            self._metrics.requests_total.labels(alias_label, "rejected").inc()
            raise

        self._metrics.streams_active.labels(alias).inc()
        self._metrics.prompt_tokens_total.labels(alias).inc(len(prompt_ids))
        outcome = "cancelled"  # unless we get to say otherwise
        progress = _Progress()
        try:
            admitted = router_pb2.Admitted(
                model_version=version.spec.version, prompt_tokens=len(prompt_ids), replica_id=dispatch.replica_id
            )
            if dispatch.model_version and dispatch.model_version != version.spec.version:
                version = models.version(dispatch.model_version)  # the fallback serves it
                admitted.model_version = version.spec.version
                admitted.degraded.append("fallback")
                max_output = min(max_output, max(1, version.context_length_tokens - len(prompt_ids)))
            if dispatch.output_cap_tokens and dispatch.output_cap_tokens < max_output:
                max_output = dispatch.output_cap_tokens
                admitted.degraded.append("output_capped")
                admitted.output_cap_tokens = dispatch.output_cap_tokens
            if version.spec.version != asked_version:
                admitted.model = models.alias_of(version.spec.version)
            yield router_pb2.GenerateEvent(admitted=admitted)
            events = self._relay_tokens(request, version, prompt_ids, max_output, dispatch, progress, here)
            async for event in events:
                if event.WhichOneof("event") == "finished":
                    outcome = FINISH_NAMES.get(event.finished.finish_reason, "error")
                elif event.WhichOneof("event") == "error":
                    outcome = "error"
                yield event
        finally:
            self._placement.release(request.request_id, progress.output_tokens)
            self._metrics.streams_active.labels(alias).dec()
            self._metrics.requests_total.labels(alias, outcome).inc()

    async def _relay_tokens(
        self,
        request: router_pb2.GenerateRequest,
        version: LoadedVersion,
        prompt_ids: list[int],
        max_output: int,
        dispatch: scheduler_pb2.Dispatch,
        progress: "_Progress",
        parent: Context,
    ) -> AsyncIterator[router_pb2.GenerateEvent]:
        alias = request.model
        events = self._replicas.session(dispatch.replica_address).open(
            replica_pb2.TokenRequest(
                request_id=request.request_id,
                prompt_token_ids=prompt_ids,
                sampling=request.sampling,
                max_output_tokens=max_output,
                service_class=request.service_class,
                fairness_key=request.tenant,
                lease=dispatch.lease,
                cache_salt=self._cache_scope.salt_for(request.tenant),
                trace_context=trace_headers(parent),
            )
        )
        detokenizer = IncrementalDetokenizer(version.tokenizer)
        stops = StopStringMatcher(tuple(request.sampling.stop))
        num_output_tokens = 0
        cached_tokens = 0
        generated = self._metrics.generation_tokens_total.labels(alias)  # once: not a label lookup per token
        started_s = time.monotonic()
        watch = ProgressWatch(events, self._stall_timeout_s, request.deadline_unix_s)
        try:
            async for event in watch:
                if event.WhichOneof("event") == "tokens":
                    token_ids = list(event.tokens.token_ids)
                    if not num_output_tokens and token_ids:
                        self._placement.started(request.request_id)
                    num_output_tokens += len(token_ids)
                    progress.output_tokens = num_output_tokens
                    cached_tokens = event.tokens.cached_prompt_tokens
                    generated.inc(len(token_ids))
                    match = stops.feed(detokenizer.push(token_ids))
                    yield _delta(match.emit, token_ids)
                    if match.stopped:
                        events.cancel()  # frees the replica's KV at its next step
                        yield _finished(common_pb2.FINISH_REASON_STOP, len(prompt_ids), cached_tokens, num_output_tokens)
                        return
                else:
                    finished = event.finished
                    match = stops.feed(detokenizer.flush())
                    tail = match.emit if match.stopped else match.emit + stops.flush()
                    if tail:
                        yield _delta(tail, [])
                    reason = common_pb2.FINISH_REASON_STOP if match.stopped else finished.finish_reason
                    yield _finished(
                        reason, len(prompt_ids), finished.usage.cached_prompt_tokens, finished.usage.output_tokens
                    )
                    return
            yield _error(Reason.REPLICA_LOST, "The model replica ended the stream without finishing; retry the request.")
        except ServiceError as failure:
            # Our own cancellation arrives as asyncio.CancelledError, not here:
            # a failure here means the replica refused or failed the request,
            # or its stream ended (e.g. it is shutting down), or the progress
            # watch ended it, or this relay fell too far behind the replica's
            # events (slow_reader). The caller hears it in-band, with who
            # failed; the finally cancels the replica's call.
            log.warning(
                "request %s on replica %s ended after %.2fs: %s",
                request.request_id, dispatch.replica_id, time.monotonic() - started_s, failure.info.message,
            )
            yield _error(failure.info.reason, _failure_message(failure))
        finally:
            watch.close()
            events.cancel()  # a no-op once it finished


def _failure_message(failure: ServiceError) -> str:
    if isinstance(failure, StreamTimeout):
        return failure.info.message  # the whole story: the replica failed nothing
    if failure.info.reason == Reason.SLOW_READER:
        return f"the router fell behind relaying it: {failure.info.message}"
    return f"the model replica failed: {failure.info.message}"


@dataclass(slots=True)
class _Progress:
    """What the relay got so far; the release reports it to the scheduler."""

    output_tokens: int = 0


def _delta(text: str, token_ids: list[int]) -> router_pb2.GenerateEvent:
    return router_pb2.GenerateEvent(delta=router_pb2.Delta(text=text, token_ids=token_ids))


def _finished(reason: int, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> router_pb2.GenerateEvent:
    usage = common_pb2.Usage(
        prompt_tokens=prompt_tokens, cached_prompt_tokens=cached_tokens, output_tokens=output_tokens
    )
    return router_pb2.GenerateEvent(finished=router_pb2.Finished(finish_reason=reason, usage=usage))


def _error(code: str, message: str) -> router_pb2.GenerateEvent:
    return router_pb2.GenerateEvent(error=router_pb2.Error(code=code, message=message))
