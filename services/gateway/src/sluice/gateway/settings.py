from pydantic import AliasChoices, Field

from sluice.config import SluiceSettings


class GatewaySettings(SluiceSettings):
    gateway_host: str = Field("127.0.0.1", description="HTTP bind address")
    gateway_port: int = Field(8000, ge=0, le=65535, description="HTTP port")
    # The variable every service reads (sluice.config), with the gateway's
    # meaning: unset, /metrics stays on the HTTP port (make run, one
    # process to scrape); set (the chart: 9090), it moves to its own port,
    # so the public port never shows tenant-labelled metrics and a
    # NetworkPolicy can open the two ports to different peers.
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="port of /metrics (at SLUICE_METRICS_HOST) instead of the HTTP port; 0 = the HTTP port",
    )
    dev_api_key: str | None = Field(
        None, description="a static key accepted for tenant SLUICE_DEV_TENANT (make run sets one); off when unset"
    )
    dev_tenant: str = Field("dev", description="tenant of the dev key")
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0, description="larger request bodies get 413")
    # Cheap pre-check before anything tokenizes: no tokenizer turns this
    # many characters into a prompt that fits any context we serve.
    max_prompt_chars: int = Field(2_000_000, gt=0, description="longer prompts get 400 before tokenizing")
    keepalive_interval_s: float = Field(10.0, gt=0, description="SSE comment after this long without an event")
    # The HTTP server's own limits (see http_edge.py; compared with NGINX's
    # and uvicorn's defaults in docs/runbook.md). A client gets this long to
    # send its request headers (NGINX client_header_timeout: 60 s; uvicorn:
    # none) and its body (NGINX: 60 s between reads; uvicorn: none): ample
    # for any real client, short enough that held connections cost the
    # sender as much as us.
    http_header_timeout_s: float = Field(10.0, gt=0, description="request headers not complete by then: 408, closed")
    http_body_timeout_s: float = Field(30.0, gt=0, description="request body not complete by then: 408")
    # NGINX's send_timeout; uvicorn has none, so a client that stops
    # reading would hold its stream, its slot and its connection for ever.
    http_write_timeout_s: float = Field(
        60.0, gt=0, description="a client that reads nothing of its response for this long is disconnected"
    )
    # Above the common load balancers' idle timeouts (60 s), so the balancer
    # closes an idle connection before we do (uvicorn's 5 s races them).
    http_keep_alive_timeout_s: float = Field(65.0, gt=0, description="an idle kept-alive connection is closed after")
    # The request line and headers (http_edge.py counts them); NGINX allows
    # 4 x 8 KiB header lines.
    http_max_header_bytes: int = Field(16 * 1024, gt=0, description="larger request heads get 400")
    http_max_connections: int = Field(4096, ge=0, description="open connections per process (then 503); 0 = no limit")
    # Off behind a proxy (all connections come from its address): limit per
    # client there instead.
    http_max_connections_per_client: int = Field(
        512, ge=0, description="open connections from one address (then 429); 0 = no limit"
    )
    # Embedded defaults: unset Redis = in-process buckets and idempotency
    # (one gateway); unset database = SQLite under .sluice/.
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("REDIS_URL", "SLUICE_REDIS_URL"),
        description="Redis for token buckets, concurrency caps and idempotency keys",
    )
    redis_key_prefix: str = Field("sluice", description="prefix of every Redis key this gateway writes")
    # While Redis is unreachable each gateway enforces 1/N of every limit in
    # memory (fail_open.py), so N gateways together hold about the limit.
    limits_fallback_gateways: int = Field(
        1, ge=1, description="gateways sharing the limits: each keeps 1/N of them while Redis is away"
    )
    limits_retry_interval_s: float = Field(5.0, gt=0, description="how often an unreachable Redis is tried again")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the usage ledger and API keys; unset = sqlite:///.sluice/ledger.db"
    )
    outbox_path: str = Field(".sluice/gateway-outbox.db", description="durable local queue of ledger rows")
    key_refresh_interval_s: float = Field(2.0, gt=0, description="how often keys are re-read (new, revoked)")
    idempotency_ttl_s: float = Field(24 * 3600.0, gt=0, description="how long a finished response is replayed")
    idempotency_lease_s: float = Field(60.0, gt=0, description="in-flight marker lease, refreshed while streaming")
    # A stream's deadline (see translate.StreamDeadline), sent to the router
    # as deadline_unix_s: the class's allowance plus this per output token.
    # Far above a healthy stream (tens of ms a token; the interactive queue
    # gives up after 10 s, batch after an hour); it ends a stream that
    # crawls, where the router's stall timeout ends one that stopped.
    stream_deadline_interactive_s: float = Field(120.0, gt=0, description="a stream's deadline: this, plus ...")
    stream_deadline_batch_s: float = Field(7200.0, gt=0, description="... this for batch (flex), plus ...")
    stream_deadline_per_token_s: float = Field(0.5, gt=0, description="... this per max_tokens (none without it)")
    default_max_tokens: int = Field(0, ge=0, description="max_tokens when a request omits it; 0 = the context's room")
    # The same variables the scheduler reads: goodput here counts a stream
    # against the TTFT its class is promised there.
    interactive_ttft_slo_s: float = Field(2.0, gt=0, description="TTFT within this: the stream met its SLO")
    batch_ttft_slo_s: float = Field(600.0, gt=0, description="the same for service_tier=flex")
