"""The waiting line of one engine: by class, then fair across tenants.

    INTERACTIVE  resumed  [s2 s7]                   preempted, by arrival
                 tenants  A:[s3 s4 s5]  B:[s8]      rotation A -> B
    BATCH        resumed  []
                 tenants  C:[s1 s6]

`peek` answers who is next: the most important class with anyone waiting;
within it resumed sequences first (they were admitted once and keep their
place in line), then the oldest sequence of the tenant at the head of the
rotation. Admitting a tenant's sequence sends that tenant to the back, so a
tenant with many waiting requests takes turns with one that has a single
request instead of going ahead of it.
"""

import bisect
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from sluice.engine.request import ServiceClass
from sluice.engine.sequence import Sequence


@dataclass(slots=True)
class _ClassLine:
    resumed: list[Sequence] = field(default_factory=list)  # sorted by arrival_index
    tenants: OrderedDict[str, deque[Sequence]] = field(default_factory=OrderedDict)  # rotation order


class WaitingQueue:
    def __init__(self) -> None:
        self._lines = {service_class: _ClassLine() for service_class in sorted(ServiceClass)}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, sequence: Sequence) -> None:
        """A new arrival: last of its tenant; a tenant new to the line joins
        the rotation at the back."""
        line = self._lines[sequence.request.service_class]
        line.tenants.setdefault(sequence.request.fairness_key, deque()).append(sequence)
        self._len += 1

    def push_resumed(self, sequence: Sequence) -> None:
        """A preempted sequence: ahead of every new arrival of its class."""
        line = self._lines[sequence.request.service_class]
        bisect.insort(line.resumed, sequence, key=lambda s: s.arrival_index)
        self._len += 1

    def peek(self, skip_keys: frozenset[str] = frozenset()) -> Sequence | None:
        """Who is next; with `skip_keys`, the next of the other tenants
        (resumed sequences are never skipped: they were admitted once)."""
        for line in self._lines.values():
            if line.resumed:
                return line.resumed[0]
            for key, queue in line.tenants.items():
                if key not in skip_keys:
                    return queue[0]
        return None

    def has_class(self, service_class: ServiceClass) -> bool:
        line = self._lines[service_class]
        return bool(line.resumed or line.tenants)

    def pop(self, sequence: Sequence) -> None:
        """Remove `sequence`, which `peek` just answered, and rotate its tenant."""
        line = self._lines[sequence.request.service_class]
        key = sequence.request.fairness_key
        if line.resumed and line.resumed[0] is sequence:
            line.resumed.pop(0)
        else:
            queue = line.tenants.get(key)
            if not queue or queue[0] is not sequence or line.resumed:
                raise ValueError(f"{sequence.request_id} is not next in line")
            queue.popleft()
            if queue:
                line.tenants.move_to_end(key)
            else:
                del line.tenants[key]
        self._len -= 1

    def remove(self, sequence: Sequence) -> None:
        """Take out a sequence anywhere in line (cancel); the rotation keeps its order."""
        line = self._lines[sequence.request.service_class]
        if sequence in line.resumed:
            line.resumed.remove(sequence)
        else:
            key = sequence.request.fairness_key
            queue = line.tenants[key]
            queue.remove(sequence)
            if not queue:
                del line.tenants[key]
        self._len -= 1
