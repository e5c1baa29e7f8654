from pydantic import AliasChoices, Field

from sluice.config import SluiceSettings


class GatewaySettings(SluiceSettings):
    gateway_host: str = Field("127.0.0.1", description="HTTP bind address")
    gateway_port: int = Field(8000, ge=0, le=65535, description="HTTP port")
    dev_api_key: str | None = Field(
        None, description="a static key accepted for tenant SLUICE_DEV_TENANT (make run sets one); off when unset"
    )
    dev_tenant: str = Field("dev", description="tenant of the dev key")
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, description="larger request bodies get 413")
    # Cheap pre-check before anything tokenizes: no tokenizer turns this
    # many characters into a prompt that fits any context we serve.
    max_prompt_chars: int = Field(2_000_000, gt=0, description="longer prompts get 400 before tokenizing")
    keepalive_interval_s: float = Field(10.0, gt=0, description="SSE comment after this long without an event")
    # Embedded defaults: unset Redis = in-process buckets and idempotency
    # (one gateway); unset database = SQLite under .sluice/.
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("REDIS_URL", "SLUICE_REDIS_URL"),
        description="Redis for token buckets, concurrency caps and idempotency keys",
    )
    redis_key_prefix: str = Field("sluice", description="prefix of every Redis key this gateway writes")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the usage ledger and API keys; unset = sqlite:///.sluice/ledger.db"
    )
    outbox_path: str = Field(".sluice/gateway-outbox.db", description="durable local queue of ledger rows")
    key_refresh_interval_s: float = Field(2.0, gt=0, description="how often keys are re-read (new, revoked)")
    idempotency_ttl_s: float = Field(24 * 3600.0, gt=0, description="how long a finished response is replayed")
    idempotency_lease_s: float = Field(60.0, gt=0, description="in-flight marker lease, refreshed while streaming")
    default_max_tokens: int = Field(0, ge=0, description="max_tokens when a request omits it; 0 = the context's room")
