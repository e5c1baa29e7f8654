from sluice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "max_output_tokens", "service_class", "fairness_key", "lease", "cache_salt", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAIRNESS_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    max_output_tokens: int
    service_class: _common_pb2.ServiceClass
    fairness_key: str
    lease: _common_pb2.Lease
    cache_salt: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_output_tokens: _Optional[int] = ..., service_class: _Optional[_Union[_common_pb2.ServiceClass, str]] = ..., fairness_key: _Optional[str] = ..., lease: _Optional[_Union[_common_pb2.Lease, _Mapping]] = ..., cache_salt: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TokenEvent(_message.Message):
    __slots__ = ("tokens", "finished")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    tokens: TokenDelta
    finished: TokenFinished
    def __init__(self, tokens: _Optional[_Union[TokenDelta, _Mapping]] = ..., finished: _Optional[_Union[TokenFinished, _Mapping]] = ...) -> None: ...

class GenerateCommand(_message.Message):
    __slots__ = ("submit", "cancel_request_id")
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    submit: TokenRequest
    cancel_request_id: str
    def __init__(self, submit: _Optional[_Union[TokenRequest, _Mapping]] = ..., cancel_request_id: _Optional[str] = ...) -> None: ...

class TokenEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[RequestEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[RequestEvent, _Mapping]]] = ...) -> None: ...

class RequestEvent(_message.Message):
    __slots__ = ("request_id", "token", "failed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: TokenEvent
    failed: _common_pb2.RequestFailed
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[_Union[TokenEvent, _Mapping]] = ..., failed: _Optional[_Union[_common_pb2.RequestFailed, _Mapping]] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("token_ids", "cached_prompt_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    cached_prompt_tokens: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class TokenFinished(_message.Message):
    __slots__ = ("finish_reason", "usage")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    usage: _common_pb2.Usage
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ...) -> None: ...

class WatchStateRequest(_message.Message):
    __slots__ = ("min_interval_s",)
    MIN_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    min_interval_s: float
    def __init__(self, min_interval_s: _Optional[float] = ...) -> None: ...

class ReplicaState(_message.Message):
    __slots__ = ("replica_id", "model_version", "total_kv_blocks", "free_kv_blocks", "block_size_tokens", "num_running", "num_waiting", "step_time_s", "ready", "at_unix_s", "max_num_seqs", "cache_stored_block_hashes", "cache_evicted_block_hashes", "cache_snapshot")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    CACHE_STORED_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    CACHE_EVICTED_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    CACHE_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model_version: str
    total_kv_blocks: int
    free_kv_blocks: int
    block_size_tokens: int
    num_running: int
    num_waiting: int
    step_time_s: float
    ready: bool
    at_unix_s: float
    max_num_seqs: int
    cache_stored_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    cache_evicted_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    cache_snapshot: bool
    def __init__(self, replica_id: _Optional[str] = ..., model_version: _Optional[str] = ..., total_kv_blocks: _Optional[int] = ..., free_kv_blocks: _Optional[int] = ..., block_size_tokens: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., step_time_s: _Optional[float] = ..., ready: _Optional[bool] = ..., at_unix_s: _Optional[float] = ..., max_num_seqs: _Optional[int] = ..., cache_stored_block_hashes: _Optional[_Iterable[bytes]] = ..., cache_evicted_block_hashes: _Optional[_Iterable[bytes]] = ..., cache_snapshot: _Optional[bool] = ...) -> None: ...
