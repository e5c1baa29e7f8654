"""Virtual token counters (VTC; Sheng et al., "Fairness in Serving Large
Language Models", OSDI 2024), per pool and class.

Each tenant has a counter of the weighted tokens it was served. The next
dispatch goes to the backlogged tenant with the smallest counter. A tenant
that becomes backlogged again is lifted to the smallest counter among the
active ones (backlogged, or holding dispatched work), so idle time is not
banked as credit that would later let it take the pool. Active, not only
backlogged: a tenant whose requests were all dispatched (or are held back
by its own KV cap) has an empty queue but is being served, and a newcomer
lifted past it to nobody's counter would then take every dispatch until it
caught up with it (measured: a 5,962-token head start repaid by the other
tenant over 14 s of a fairness run, twice the bound).

A dispatch charges its prompt and its bounded output at once (the scheduler
decides before the tokens exist); the release corrects the output part to
what was generated. With whole-request charging, two backlogged tenants'
counters never differ by more than the largest single request cost (the
tenant behind is picked until it passes the other), the analogue of the
paper's 2 x max(w_p L_input, w_q M) bound for per-token charging.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class VirtualTokenCounters:
    input_weight: float = 1.0
    output_weight: float = 2.0
    counters: dict[str, float] = field(default_factory=dict)
    # Served weighted tokens, never lifted: what each tenant really got.
    served: dict[str, float] = field(default_factory=dict)
    # Dispatched and not yet released, per tenant (only tenants with some).
    in_flight: dict[str, int] = field(default_factory=dict)
    max_request_cost: float = 0.0

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.input_weight * prompt_tokens + self.output_weight * output_tokens

    def lift(self, tenant: str, backlogged: Iterable[str]) -> None:
        """`tenant` is about to become backlogged; `backlogged` are the others
        with queued work (tenants with work in flight count as well)."""
        active = set(backlogged) | self.in_flight.keys()
        others = [self.counters.get(t, 0.0) for t in active if t != tenant]
        current = self.counters.get(tenant, 0.0)
        self.counters[tenant] = max(current, min(others)) if others else current

    def pick(self, tenants: Iterable[str]) -> str | None:
        """The tenant with the smallest counter (ties: the name, for determinism)."""
        return min(tenants, key=lambda t: (self.counters.get(t, 0.0), t), default=None)

    def charge_dispatch(self, tenant: str, prompt_tokens: int, output_tokens: int) -> None:
        cost = self.cost(prompt_tokens, output_tokens)
        self.max_request_cost = max(self.max_request_cost, cost)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost
        self.served[tenant] = self.served.get(tenant, 0.0) + self.input_weight * prompt_tokens
        self.in_flight[tenant] = self.in_flight.get(tenant, 0) + 1

    def settle_release(self, tenant: str, charged_output_tokens: int, served_output_tokens: int) -> None:
        delta = self.output_weight * (served_output_tokens - charged_output_tokens)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + delta
        self.served[tenant] = self.served.get(tenant, 0.0) + self.output_weight * served_output_tokens
        self.abandon(tenant)

    def abandon(self, tenant: str) -> None:
        """A dispatched request ended without a count of what it generated
        (its router went away): its charge stands, it is no longer in flight."""
        left = self.in_flight.get(tenant, 0) - 1
        if left > 0:
            self.in_flight[tenant] = left
        else:
            self.in_flight.pop(tenant, None)

    @property
    def fairness_bound(self) -> float:
        """How far two backlogged tenants' counters may drift apart."""
        return self.max_request_cost

    @property
    def served_fairness_bound(self) -> float:
        """How far two backlogged tenants' served tokens may drift apart.

        Served tokens lag a counter by the output charged at dispatch and
        not yet generated (requests in flight); VTC keeps that about equal
        across backlogged tenants, but it can differ by up to one more
        request cost at any instant, hence twice the counter bound (the
        same factor as the paper's bound for per-token charging)."""
        return 2 * self.max_request_cost
