"""Bearer-key authentication: key -> tenant."""

import hmac
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request

from sluice.gateway.errors import ApiError


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    is_admin: bool = False


class Authenticator(Protocol):
    def tenant_for(self, api_key: str) -> Tenant | None: ...


class StaticKeyAuthenticator:
    """One configured key (the dev key of `make run`). Hashed, revocable keys
    from the key store replace it in production."""

    def __init__(self, api_key: str | None, tenant: str) -> None:
        self._api_key = api_key
        self._tenant = Tenant(tenant)

    def tenant_for(self, api_key: str) -> Tenant | None:
        if self._api_key and hmac.compare_digest(api_key.encode(), self._api_key.encode()):
            return self._tenant
        return None


def authenticate(request: Request, authenticator: Authenticator) -> Tenant:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "Missing API key: send `Authorization: Bearer <key>`.", "missing_api_key")
    tenant = authenticator.tenant_for(key.strip())
    if tenant is None:
        raise ApiError(401, "Incorrect API key provided.", "invalid_api_key")
    return tenant
