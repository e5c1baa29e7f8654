"""One pool's queue for one class: a FIFO per tenant, served by VTC.

    tenant A  [a1 a2 a3]      counters A: 900
    tenant B  [b1]                     B: 120   -> next: b1
    tenant C  []  (not backlogged)

Bounded in total entries; entries leave when dispatched, cancelled, or
past their deadline. Entries that cannot go now (a long prompt while the
long-prefill lane is full) are skipped, not blocked on.
"""

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sluice.placement.asks import Ask
from sluice.placement.vtc import VirtualTokenCounters


@dataclass(slots=True)
class QueueEntry:
    ask: Ask
    enqueued_s: float
    deadline_s: float
    kv_blocks: int
    output_tokens: int  # the bounded output its reservation covers
    is_long: bool
    output_cap_tokens: int = 0  # the overload cap it was admitted under; 0 = none


class ClassQueue:
    def __init__(self, counters: VirtualTokenCounters) -> None:
        self.counters = counters
        self._by_tenant: OrderedDict[str, deque[QueueEntry]] = OrderedDict()
        self._by_id: dict[str, QueueEntry] = {}
        self.kv_blocks = 0  # queued blocks, kept for the admission arithmetic
        # Queued blocks per tenant, kept with the lines: admission asks for
        # them on every enqueue, so they are not summed over the queue.
        self._tenant_blocks: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> QueueEntry | None:
        return self._by_id.get(request_id)

    def push(self, entry: QueueEntry) -> None:
        tenant = entry.ask.tenant
        if tenant not in self._by_tenant:
            self.counters.lift(tenant, self._by_tenant.keys())
            self._by_tenant[tenant] = deque()
            self._tenant_blocks[tenant] = 0
        self._by_tenant[tenant].append(entry)
        self._by_id[entry.ask.request_id] = entry
        self.kv_blocks += entry.kv_blocks
        self._tenant_blocks[tenant] += entry.kv_blocks

    def next_entry(self, may_go: Callable[[QueueEntry], bool]) -> QueueEntry | None:
        """The oldest entry that `may_go` of the smallest-counter tenant
        that has one. An entry held back (a long prompt while the lane is
        full) does not hold back its tenant's entries behind it."""
        first_eligible: dict[str, QueueEntry] = {}
        for tenant, line in self._by_tenant.items():
            entry = next((e for e in line if may_go(e)), None)
            if entry is not None:
                first_eligible[tenant] = entry
        tenant = self.counters.pick(first_eligible)
        return None if tenant is None else first_eligible[tenant]

    def remove(self, request_id: str) -> QueueEntry | None:
        entry = self._by_id.pop(request_id, None)
        if entry is None:
            return None
        tenant = entry.ask.tenant
        line = self._by_tenant[tenant]
        line.remove(entry)
        self._tenant_blocks[tenant] -= entry.kv_blocks
        if not line:
            del self._by_tenant[tenant]
            del self._tenant_blocks[tenant]
        self.kv_blocks -= entry.kv_blocks
        return entry

    def entries(self) -> Iterator[QueueEntry]:
        return iter(list(self._by_id.values()))

    def oldest_enqueued_s(self, counts: Callable[[QueueEntry], bool] | None = None) -> float | None:
        """When the oldest entry (of those `counts` accepts) was enqueued.
        Each tenant's line is FIFO: its first accepted entry is its oldest."""
        if counts is None:
            return min((line[0].enqueued_s for line in self._by_tenant.values()), default=None)
        firsts = (next((e.enqueued_s for e in line if counts(e)), None) for line in self._by_tenant.values())
        return min((s for s in firsts if s is not None), default=None)

    def tenant_oldest_enqueued_s(self) -> dict[str, float]:
        """Per queued tenant: when its oldest entry was enqueued (each line is FIFO)."""
        return {tenant: line[0].enqueued_s for tenant, line in self._by_tenant.items()}

    def tenant_work(self) -> dict[str, tuple[int, int]]:
        """Per tenant: (queued entries, queued KV blocks)."""
        return {t: self.tenant_queued(t) for t in self._by_tenant}

    def tenant_queued(self, tenant: str) -> tuple[int, int]:
        """(queued entries, queued KV blocks) of one tenant."""
        line = self._by_tenant.get(tenant)
        return (len(line), self._tenant_blocks[tenant]) if line else (0, 0)
