"""Tenants as metric labels: the first `max_tenants` seen keep their name,
every later one is `other`, so a flood of new keys cannot blow up the
series count (a value a client sent is never a label unbounded)."""

OTHER = "other"


class TenantLabels:
    def __init__(self, max_tenants: int = 20) -> None:
        self._max_tenants = max_tenants
        self._named: set[str] = set()

    def __call__(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        if len(self._named) < self._max_tenants:
            self._named.add(tenant)
            return tenant
        return OTHER
