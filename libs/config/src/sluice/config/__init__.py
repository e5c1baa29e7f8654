"""Settings shared by all services: SLUICE_-prefixed environment variables,
validated once at start-up (pydantic-settings). Each service declares its
own settings class on top of `SluiceSettings`; the names here are the ones
several services must agree on."""

from sluice.config.settings import SluiceSettings

__all__ = ["SluiceSettings"]
