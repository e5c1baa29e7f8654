"""Bearer-key authentication: key -> tenant and its limits.

Keys live hashed in the ledger database (`sluice keys create`). The gateway
keeps every active key in memory and re-reads them every few seconds, so a
new or revoked key takes effect within `key_refresh_interval_s` without a
database round trip per request.
"""

import asyncio
import hmac
import logging
from dataclasses import dataclass, field
from typing import Protocol

from starlette.requests import Request

from sluice.gateway.errors import ApiError
from sluice.ledger import ApiKeyRecord, KeyStore, hash_key
from sluice.limits import TenantLimits
from sluice.outcomes import Reason

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    is_admin: bool = False
    limits: TenantLimits = field(default_factory=TenantLimits)
    max_concurrency: int | None = None
    # The key's overload policy, passed to the scheduler with each request:
    # exempt from every overload stage; may have its output capped in
    # overload; may be served by a smaller fallback version in overload.
    critical: bool = False
    degradable: bool = False
    allow_fallback: bool = False

    @classmethod
    def from_record(cls, record: ApiKeyRecord) -> "Tenant":
        return cls(
            name=record.tenant,
            is_admin=record.is_admin,
            limits=TenantLimits(record.tokens_per_minute, record.requests_per_minute),
            max_concurrency=record.max_concurrency,
            critical=record.priority == "critical",
            degradable=record.degradable,
            allow_fallback=record.allow_fallback,
        )


class Authenticator(Protocol):
    def tenant_for(self, api_key: str) -> Tenant | None: ...


class KeyCache:
    """Active keys by hash, refreshed from the key store in the background.

    Only the refresh task writes `_by_hash` (replacing the whole dict), so
    request handlers read a consistent snapshot without locks.
    """

    def __init__(self, keys: KeyStore, refresh_interval_s: float, dev_key: str | None, dev_tenant: str) -> None:
        self._keys = keys
        self._refresh_interval_s = refresh_interval_s
        self._dev_key = dev_key
        self._dev_tenant = Tenant(dev_tenant)
        self._by_hash: dict[str, Tenant] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def refresh(self) -> None:
        records = await asyncio.to_thread(self._keys.active_keys)
        self._by_hash = {key_hash: Tenant.from_record(record) for key_hash, record in records.items()}

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_interval_s)
            try:
                await self.refresh()
            except Exception:  # a database blip keeps the last known keys
                log.warning("could not refresh API keys; keeping %d cached", len(self._by_hash), exc_info=True)

    def tenant_for(self, api_key: str) -> Tenant | None:
        if self._dev_key and hmac.compare_digest(api_key.encode(), self._dev_key.encode()):
            return self._dev_tenant
        return self._by_hash.get(hash_key(api_key))


def authenticate(request: Request, authenticator: Authenticator) -> Tenant:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError.of(Reason.MISSING_API_KEY, "Missing API key: send `Authorization: Bearer <key>`.")
    tenant = authenticator.tenant_for(key.strip())
    if tenant is None:
        raise ApiError.of(Reason.INVALID_API_KEY, "Incorrect API key provided.")
    return tenant
