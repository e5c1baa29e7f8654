"""Base settings class and the addresses the services share."""

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SluiceSettings(BaseSettings):
    """Fields every service reads. Environment: SLUICE_<FIELD>, e.g.
    SLUICE_ROUTER_ADDRESS. Unknown SLUICE_ variables are ignored so one
    environment can configure all four services."""

    model_config = SettingsConfigDict(env_prefix="SLUICE_", extra="ignore", frozen=True)

    router_address: str = Field("127.0.0.1:50051", description="host:port of the router's gRPC server")
    scheduler_address: str = Field("127.0.0.1:50052", description="host:port of the scheduler's gRPC server")
    metrics_host: str = Field("127.0.0.1", description="address the /metrics endpoint of a gRPC service binds")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics port of a gRPC service; 0 = off")
    shutdown_grace_s: float = Field(10.0, ge=0, description="time in-flight streams get after SIGTERM")
    # The model the router and replica serve when no catalog file is given.
    model_dir: str = Field(".sluice/models/tiny-llama", description="Hugging Face checkpoint directory")
    model_name: str = Field("tiny-llama", description="alias clients send as `model`")
    model_version: str = Field("tiny-llama-v1", description="version id; router and replicas must agree")
    log_level: str = Field("INFO", description="Python logging level")
    log_format: Literal["text", "json"] = Field(
        "text", description="text (a line for a terminal) or json (one object per line with trace_id; the chart's default)",
    )
    # Read by every multiplexed call's caller side (the gateway's router
    # session, the router's replica sessions). 256 is
    # sluice.rpc.multiplex_client.DEFAULT_MAX_UNDELIVERED_EVENTS, which says
    # why (this package imports no rpc; a test keeps the two equal).
    stream_buffer_events: int = Field(
        256, ge=1, description="events one stream may hold for a reader that fell behind; past it the request "
        "is cancelled upstream and ends with slow_reader",
    )
