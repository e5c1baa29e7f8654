"""What the router asks the scheduler for, and what the scheduler answers."""

from dataclasses import dataclass
from enum import IntEnum

from sluice.outcomes import Reason


class ServiceClass(IntEnum):
    """Smaller is served first."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass(frozen=True, slots=True)
class Ask:
    request_id: str
    owner: str  # the router stream that sent it; its entries go when it breaks
    tenant: str
    model_version: str
    service_class: ServiceClass
    prompt_tokens: int
    requested_output_tokens: int  # max_tokens as given; 0 = not given
    max_output_tokens: int        # the room the context leaves after the prompt
    prompt_block_hashes: tuple[bytes, ...] = ()
    block_size_tokens: int = 0    # what the hashes were computed at (0 = none sent)
    deadline_s: float = 0.0       # the client's, on the scheduler's clock; 0 = the class's
    # From the tenant's key: exempt from overload levers, may use the
    # critical reserve; may be output-capped in overload; may be served by
    # this version (same tokenizer, smaller model) in overload ("" = none).
    critical: bool = False
    degradable: bool = False
    fallback_model_version: str = ""


@dataclass(frozen=True, slots=True)
class Dispatched:
    request_id: str
    owner: str
    replica_id: str
    address: str
    reserved_kv_blocks: int
    queued_s: float
    cached_prefix_blocks: int  # prompt blocks the chosen replica already holds
    model_version: str = ""    # the version that serves it (the ask's, or its fallback's)
    output_cap_tokens: int = 0  # an overload cap on its output; 0 = none


@dataclass(frozen=True, slots=True)
class Refused:
    request_id: str
    owner: str
    reason: Reason
    message: str
    retry_after_s: float
    predicted_start_s: float | None = None  # the prediction that refused it, if one did


@dataclass(frozen=True, slots=True)
class Queued:
    request_id: str
    predicted_start_s: float  # seconds until it is expected to be dispatched
    model_version: str = ""   # the pool it queues in (its fallback's, if routed there)
