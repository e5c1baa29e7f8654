from typing import Literal

from pydantic import Field

from sluice.config import SluiceSettings
from sluice.router.progress_watch import DEFAULT_STALL_TIMEOUT_S
from sluice.router.recent_assignments import DEFAULT_MAX_ENTRIES, DEFAULT_TTL_S
from sluice.router.tenant_gate import DEFAULT_PER_TENANT


class RouterSettings(SluiceSettings):
    models_file: str | None = Field(
        None,
        description="JSON model catalog (aliases, versions, rollout weights); unset = the single "
        "SLUICE_MODEL_NAME/VERSION/DIR model",
    )
    # Polling the content, not watching events: a mounted ConfigMap changes
    # by a symlink swap that inotify and mtimes report unreliably. A poll is
    # one small read and a hash.
    catalog_reload_interval_s: float = Field(
        2.0, ge=0, description="how often the models file is re-read; a change applies without a restart "
        "(0 = read once at start)",
    )
    # A retry of a recent request id keeps the version it got, across weight changes.
    sticky_assignment_ttl_s: float = Field(DEFAULT_TTL_S, gt=0, description="how long a request id's version is remembered")
    sticky_assignment_max_entries: int = Field(
        DEFAULT_MAX_ENTRIES, ge=1, description="request ids remembered at most (the least recent forgotten first)"
    )
    # Per-class prompt caps, below the model's context: interactive calls
    # with enormous prompts would wreck the latency SLO of everyone else.
    interactive_max_prompt_tokens: int = Field(0, ge=0, description="0 = the model's context")
    batch_max_prompt_tokens: int = Field(0, ge=0, description="0 = the model's context")
    # A backstop: the scheduler answers every queued request by its own
    # deadline (SLUICE_INTERACTIVE_MAX_QUEUE_WAIT_S), so this only fires if
    # the scheduler stops answering; keep it above the longest queue wait.
    placement_timeout_s: float = Field(3700.0, gt=0, description="how long a request may wait for a placement")
    kv_block_size_tokens: int = Field(
        16, ge=1, description="block size the prompt's prefix hashes are computed at (the replicas' block size)"
    )
    tokenize_per_tenant: int = Field(
        DEFAULT_PER_TENANT, ge=1,
        description="one tenant's long prompts (2,048 characters or more) tokenized at once (the rest wait their "
        "turn, not the others'); shorter ones are tokenized on the event loop",
    )
    # See cache_scope.py: by default no tenant's request hits another's
    # cached prefix (a hit is visible as a faster first token).
    prefix_cache_scope: Literal["tenant", "shared"] = Field(
        "tenant", description="tenant: each tenant (or group) caches apart; shared: one prefix cache for all"
    )
    prefix_cache_groups: dict[str, str] = Field(
        default_factory=dict, description='JSON {"tenant": "group"}: tenants of one group share their prefix cache'
    )
    # Why 30 s: where the default lives (progress_watch).
    stream_stall_timeout_s: float = Field(
        DEFAULT_STALL_TIMEOUT_S, gt=0,
        description="a stream whose replica sends nothing for this long is cancelled there and ends with "
        "replica_lost (retryable)",
    )
