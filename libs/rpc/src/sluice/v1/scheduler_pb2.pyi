from sluice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlacementRequest(_message.Message):
    __slots__ = ("enqueue", "release", "started")
    ENQUEUE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    enqueue: Enqueue
    release: Release
    started: Started
    def __init__(self, enqueue: _Optional[_Union[Enqueue, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., started: _Optional[_Union[Started, _Mapping]] = ...) -> None: ...

class Enqueue(_message.Message):
    __slots__ = ("request_id", "tenant", "model_version", "service_class", "prompt_tokens", "max_output_tokens", "deadline_unix_s", "requested_output_tokens", "prompt_block_hashes", "block_size_tokens", "critical", "degradable", "fallback_model_version", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_FIELD_NUMBER: _ClassVar[int]
    DEGRADABLE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    model_version: str
    service_class: _common_pb2.ServiceClass
    prompt_tokens: int
    max_output_tokens: int
    deadline_unix_s: float
    requested_output_tokens: int
    prompt_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    block_size_tokens: int
    critical: bool
    degradable: bool
    fallback_model_version: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., model_version: _Optional[str] = ..., service_class: _Optional[_Union[_common_pb2.ServiceClass, str]] = ..., prompt_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., deadline_unix_s: _Optional[float] = ..., requested_output_tokens: _Optional[int] = ..., prompt_block_hashes: _Optional[_Iterable[bytes]] = ..., block_size_tokens: _Optional[int] = ..., critical: _Optional[bool] = ..., degradable: _Optional[bool] = ..., fallback_model_version: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("request_id", "output_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    output_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("request_id", "dispatch", "reject")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    dispatch: Dispatch
    reject: Reject
    def __init__(self, request_id: _Optional[str] = ..., dispatch: _Optional[_Union[Dispatch, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ...) -> None: ...

class Dispatch(_message.Message):
    __slots__ = ("replica_id", "replica_address", "lease", "model_version", "output_cap_tokens")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    replica_address: str
    lease: _common_pb2.Lease
    model_version: str
    output_cap_tokens: int
    def __init__(self, replica_id: _Optional[str] = ..., replica_address: _Optional[str] = ..., lease: _Optional[_Union[_common_pb2.Lease, _Mapping]] = ..., model_version: _Optional[str] = ..., output_cap_tokens: _Optional[int] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("reason", "message", "retry_after_s")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    reason: str
    message: str
    retry_after_s: float
    def __init__(self, reason: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...
