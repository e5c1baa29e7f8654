"""Which requests may share prefix-cache blocks.

A cache hit is visible from outside: the first token comes sooner. If any
tenant's request could hit blocks another tenant's prompt left behind, a
tenant could learn, by timing, whether someone else sent a given prompt
(a system prompt, a document). So by default every tenant has its own
scope: the replica chains its block hashes from a root salted with the
scope (sluice.engine.block_hash.root_block_hash), and the router hashes the
prompt the same way for prefix-aware placement. A platform whose tenants
trust each other (one company's teams) puts them in a group, or shares the
cache across everyone.

    scope = CacheScope(shared=False, groups={"team-a": "acme", "team-b": "acme"})
    scope.salt_for("team-a") == scope.salt_for("team-b") != scope.salt_for("other")
"""

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CacheScope:
    shared: bool = False  # one cache for every tenant
    groups: Mapping[str, str] = field(default_factory=dict)  # tenant -> group sharing one cache

    def salt_for(self, tenant: str) -> str:
        if self.shared:
            return ""
        group = self.groups.get(tenant)
        # Prefixed, so a tenant named like a group never shares its scope.
        return f"group:{group}" if group is not None else f"tenant:{tenant}"
