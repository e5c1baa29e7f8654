from sluice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "model", "chat", "prompt_text", "sampling", "max_output_tokens", "service_class", "deadline_unix_s", "critical", "degradable", "allow_fallback", "trace_context", "affinity_key")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_FIELD_NUMBER: _ClassVar[int]
    DEGRADABLE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    model: str
    chat: ChatMessages
    prompt_text: str
    sampling: _common_pb2.SamplingParams
    max_output_tokens: int
    service_class: _common_pb2.ServiceClass
    deadline_unix_s: float
    critical: bool
    degradable: bool
    allow_fallback: bool
    trace_context: _containers.ScalarMap[str, str]
    affinity_key: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[str] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_output_tokens: _Optional[int] = ..., service_class: _Optional[_Union[_common_pb2.ServiceClass, str]] = ..., deadline_unix_s: _Optional[float] = ..., critical: _Optional[bool] = ..., degradable: _Optional[bool] = ..., allow_fallback: _Optional[bool] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., affinity_key: _Optional[str] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("admitted", "delta", "finished", "error")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    admitted: Admitted
    delta: Delta
    finished: Finished
    error: Error
    def __init__(self, admitted: _Optional[_Union[Admitted, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class Admitted(_message.Message):
    __slots__ = ("model_version", "prompt_tokens", "replica_id", "model", "degraded", "output_cap_tokens")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    prompt_tokens: int
    replica_id: str
    model: str
    degraded: _containers.RepeatedScalarFieldContainer[str]
    output_cap_tokens: int
    def __init__(self, model_version: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., degraded: _Optional[_Iterable[str]] = ..., output_cap_tokens: _Optional[int] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("finish_reason", "usage")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    usage: _common_pb2.Usage
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class RouterCommand(_message.Message):
    __slots__ = ("generate", "cancel_request_id")
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    generate: GenerateRequest
    cancel_request_id: str
    def __init__(self, generate: _Optional[_Union[GenerateRequest, _Mapping]] = ..., cancel_request_id: _Optional[str] = ...) -> None: ...

class GenerateEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[RoutedEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[RoutedEvent, _Mapping]]] = ...) -> None: ...

class RoutedEvent(_message.Message):
    __slots__ = ("request_id", "event", "failed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    event: GenerateEvent
    failed: _common_pb2.RequestFailed
    def __init__(self, request_id: _Optional[str] = ..., event: _Optional[_Union[GenerateEvent, _Mapping]] = ..., failed: _Optional[_Union[_common_pb2.RequestFailed, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("id", "versions", "context_length_tokens", "created_unix_s")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    id: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    context_length_tokens: int
    created_unix_s: float
    def __init__(self, id: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., context_length_tokens: _Optional[int] = ..., created_unix_s: _Optional[float] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...
