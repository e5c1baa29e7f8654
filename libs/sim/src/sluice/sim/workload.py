"""Synthetic workloads: who sends what, and when.

A `Workload` is an arrival process (when requests come) and a mix of
`RequestClass`es (what each one is: its service class, tenant and prompt and
output lengths). `Workload.generate(duration_s, seed)` turns it into the
`SimRequest`s the simulator replays; the same seed gives the same list.

    Workload(arrivals=Poisson(10.0), classes=(chat, document, batch))
      .generate(3600.0, seed=7)
      -> [SimRequest(request_id="r0000000", arrival_s=0.08, tenant="tenant-2",
                     service_class="interactive", prompt_tokens=183, ...), ...]

Randomness comes only from `random.Random` instances seeded by the caller,
never from the module-level generator, so a run is reproducible from its
seed alone.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# The two queues of the design (interactive under a latency SLO, batch on
# leftover capacity), spelled as the ledger and the API spell them; the
# simulator maps them onto sluice.placement.asks.ServiceClass.
SERVICE_CLASSES: tuple[str, ...] = ("interactive", "batch")

# Tenants of a generated workload are named tenant-0, tenant-1, ...
DEFAULT_TENANTS: tuple[str, ...] = ("tenant-0",)


def request_id(n: int) -> str:
    """The id of the n-th request of a generated or replayed workload."""
    return f"r{n:07d}"


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request as a client sends it, with the output it will generate.

    `output_tokens` is what the request generates (the simulator runs it with
    ignore_eos, so exactly that many); `requested_max_tokens` is the
    `max_tokens` the client sends, which is what admission reserves KV for.
    Left out, it is `output_tokens`: a client that bounds its output exactly.
    `shared_prefix_tokens` leading prompt tokens are the same for every
    request of the tenant that carries them (a system prompt), so a prefix
    cache can hold them; 0 means none.
    """

    request_id: str
    arrival_s: float
    tenant: str
    service_class: str
    prompt_tokens: int
    output_tokens: int
    # None only until __post_init__ fills in output_tokens; always an int after.
    requested_max_tokens: int | None = None
    shared_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.requested_max_tokens is None:
            object.__setattr__(self, "requested_max_tokens", self.output_tokens)
        if not self.arrival_s >= 0.0:  # also rejects NaN
            raise ValueError(f"{self.request_id}: arrival_s must be >= 0, got {self.arrival_s}")
        if self.service_class not in SERVICE_CLASSES:
            raise ValueError(f"{self.request_id}: service_class must be one of {SERVICE_CLASSES}, "
                             f"got {self.service_class!r}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"{self.request_id}: prompt_tokens and output_tokens must be >= 1, "
                             f"got {self.prompt_tokens} and {self.output_tokens}")
        if self.requested_max_tokens < self.output_tokens:
            # A client bound below the output would have cut the output short.
            raise ValueError(f"{self.request_id}: requested_max_tokens {self.requested_max_tokens} "
                             f"is below output_tokens {self.output_tokens}")
        if not 0 <= self.shared_prefix_tokens <= self.prompt_tokens:
            raise ValueError(f"{self.request_id}: shared_prefix_tokens must be in [0, prompt_tokens], "
                             f"got {self.shared_prefix_tokens} of {self.prompt_tokens}")


# --- arrival processes ---------------------------------------------------------------------


class ArrivalProcess(Protocol):
    def arrivals(self, duration_s: float, rng: random.Random) -> list[float]:
        """Sorted arrival times in [0, duration_s)."""
        ...


def _renewal_arrivals(duration_s: float, next_gap_s: Callable[[], float]) -> list[float]:
    """Arrival times of a renewal process started at 0: the first request
    arrives one gap after 0, each later one a fresh gap after the last."""
    if not duration_s >= 0.0:
        raise ValueError(f"duration_s must be >= 0, got {duration_s}")
    times: list[float] = []
    t = next_gap_s()
    while t < duration_s:
        times.append(t)
        t += next_gap_s()
    return times


@dataclass(frozen=True, slots=True)
class Poisson:
    """Independent arrivals at a constant mean rate: exponential gaps."""

    rate_per_s: float

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0.0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")

    def arrivals(self, duration_s: float, rng: random.Random) -> list[float]:
        rate = self.rate_per_s
        return _renewal_arrivals(duration_s, lambda: rng.expovariate(rate))


@dataclass(frozen=True, slots=True)
class GammaBursty:
    """Arrivals at a mean rate whose gaps are gamma-distributed with squared
    coefficient of variation `burst_factor` (variance / mean²).

    A gamma(shape k, scale θ) gap has mean kθ and CV² 1/k, so for mean
    1/rate and CV² b:  k = 1/b,  θ = b/rate.  b = 1 is Poisson (exponential
    gaps); b > 1 bunches requests into bursts separated by lulls at the same
    mean rate (b = 4: gaps' standard deviation twice their mean); b < 1 is
    smoother than Poisson, approaching a fixed period as b -> 0.
    """

    rate_per_s: float
    burst_factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0.0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")
        if not self.burst_factor > 0.0:
            raise ValueError(f"burst_factor must be > 0, got {self.burst_factor}")

    @property
    def shape(self) -> float:
        return 1.0 / self.burst_factor

    @property
    def scale_s(self) -> float:
        return self.burst_factor / self.rate_per_s

    def arrivals(self, duration_s: float, rng: random.Random) -> list[float]:
        shape, scale_s = self.shape, self.scale_s
        return _renewal_arrivals(duration_s, lambda: rng.gammavariate(shape, scale_s))


# --- length distributions ------------------------------------------------------------------


class LengthDist(Protocol):
    def sample(self, rng: random.Random) -> int:
        """A token count >= 1."""
        ...


@dataclass(frozen=True, slots=True)
class Fixed:
    tokens: int

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens}")

    def sample(self, rng: random.Random) -> int:
        return self.tokens


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Token counts whose logarithm is normal: the long right tail of real
    prompt and output lengths. `median_tokens` is exp(mu); `sigma` is the
    standard deviation of the log (0.5: the middle 68% spans x0.6-x1.65 of the
    median; 1.0: x0.37-x2.7). Samples are rounded, then clamped to
    [min_tokens, max_tokens] (a context window, a client's limit)."""

    median_tokens: float
    sigma: float
    min_tokens: int
    max_tokens: int

    def __post_init__(self) -> None:
        if not self.median_tokens > 0.0 or not self.sigma >= 0.0:
            raise ValueError(f"median_tokens must be > 0 and sigma >= 0: {self}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"need 1 <= min_tokens <= max_tokens: {self}")

    def sample(self, rng: random.Random) -> int:
        tokens = round(rng.lognormvariate(math.log(self.median_tokens), self.sigma))
        return min(max(tokens, self.min_tokens), self.max_tokens)


@dataclass(frozen=True, slots=True)
class Empirical:
    """Uniform over observed values (e.g. a trace's prompt lengths): repeats
    make a value proportionally more likely."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))  # accept any sequence
        if not self.values:
            raise ValueError("Empirical needs at least one value")
        if min(self.values) < 1:
            raise ValueError(f"every value must be >= 1, got {min(self.values)}")

    def sample(self, rng: random.Random) -> int:
        return rng.choice(self.values)


# --- mixes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One kind of request in a mix. `share` is its weight among arrivals
    (shares are normalised over the mix, so 3 and 1 mean 75% and 25%).
    Each request's tenant is drawn uniformly from `tenants` by the workload's
    rng: random rather than round-robin so that no tenant's requests line up
    with another class's and a tenant's arrivals stay a thinned copy of the
    whole process. `shared_prefix_tokens` is the length of a prefix shared by
    all of a tenant's requests of this class, cut to a shorter prompt.
    `requested_max_tokens`, when set, is a fixed `max_tokens` the clients
    send (one that over-asks, as most do); outputs longer than it are cut to
    it. Left None, each request asks for exactly its output.
    """

    name: str
    share: float
    service_class: str
    prompt: LengthDist
    output: LengthDist
    tenants: tuple[str, ...] = DEFAULT_TENANTS
    shared_prefix_tokens: int = 0
    requested_max_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenants", tuple(self.tenants))
        if not self.share >= 0.0 or math.isinf(self.share):
            raise ValueError(f"{self.name}: share must be a finite number >= 0, got {self.share}")
        if self.service_class not in SERVICE_CLASSES:
            raise ValueError(f"{self.name}: service_class must be one of {SERVICE_CLASSES}, "
                             f"got {self.service_class!r}")
        if not self.tenants:
            raise ValueError(f"{self.name}: needs at least one tenant")
        if self.shared_prefix_tokens < 0:
            raise ValueError(f"{self.name}: shared_prefix_tokens must be >= 0")
        if self.requested_max_tokens is not None and self.requested_max_tokens < 1:
            raise ValueError(f"{self.name}: requested_max_tokens must be >= 1 or None")

    def make_request(self, n: int, arrival_s: float, rng: random.Random) -> SimRequest:
        tenant = rng.choice(self.tenants)
        prompt_tokens = self.prompt.sample(rng)
        output_tokens = self.output.sample(rng)
        if self.requested_max_tokens is not None:
            output_tokens = min(output_tokens, self.requested_max_tokens)
        return SimRequest(
            request_id=request_id(n), arrival_s=arrival_s, tenant=tenant,
            service_class=self.service_class, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            requested_max_tokens=self.requested_max_tokens or output_tokens,
            shared_prefix_tokens=min(self.shared_prefix_tokens, prompt_tokens),
        )


@dataclass(frozen=True, slots=True)
class Workload:
    arrivals: ArrivalProcess
    classes: tuple[RequestClass, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        if not self.classes:
            raise ValueError("a workload needs at least one request class")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"request class names must be unique: {names}")
        if not sum(c.share for c in self.classes) > 0.0:
            raise ValueError("at least one request class needs a share > 0")

    def generate(self, duration_s: float, seed: int) -> list[SimRequest]:
        """The requests arriving in [0, duration_s), in arrival order.

        Arrival times and request contents come from two generators seeded
        from `seed` separately, so the n-th request has the same class,
        tenant and lengths whatever the arrival process: a sweep over rates
        or burstiness with one seed changes only when requests come (common
        random numbers, which make side-by-side runs comparable).
        """
        times = self.arrivals.arrivals(duration_s, random.Random(f"{seed}:arrivals"))
        rng = random.Random(f"{seed}:requests")
        cumulative = list(itertools.accumulate(c.share for c in self.classes))
        total = cumulative[-1]
        last = len(self.classes) - 1
        requests = []
        for n, arrival_s in enumerate(times):
            # bisect_right skips zero-share classes; min() guards the float edge at total.
            index = min(bisect.bisect_right(cumulative, rng.random() * total), last)
            requests.append(self.classes[index].make_request(n, arrival_s, rng))
        return requests


def tenant_names(count: int) -> tuple[str, ...]:
    if count < 1:
        raise ValueError(f"need at least one tenant, got {count}")
    return tuple(f"tenant-{i}" for i in range(count))


def seed_mix(rate_per_s: float, burst_factor: float = 1.0, *, chat_share: float = 0.75,
             document_share: float = 0.10, batch_share: float = 0.15,
             tenants: Sequence[str] = tenant_names(4)) -> Workload:
    """The mix the design is written against: short chats beside 32K
    documents, with a batch class underneath.

    | class    | share | service     | prompt tokens                  | output tokens                |
    |----------|-------|-------------|--------------------------------|------------------------------|
    | chat     | 0.75  | interactive | LogNormal(200, 0.8), 8..4,096  | LogNormal(150, 0.8), 1..1,024 |
    | document | 0.10  | interactive | LogNormal(31,000, 0.05), 16,384..32,768 | LogNormal(300, 0.5), 16..1,024 |
    | batch    | 0.15  | batch       | LogNormal(2,000, 0.6), 64..8,192 | LogNormal(500, 0.6), 16..2,048 |

    Why these numbers:
    - chat: "200-token chat prompts" (the seed) is the median; sigma 0.8
      gives the usual long tail (p90 ~560, p99 ~1,290 tokens), capped at 4K
      where a chat turn would have become a document. Outputs are a reply of
      a paragraph or two (median 150, p99 ~960).
    - document: "32K document prompts" are callers filling a 32K context
      window: median 31,000 with a tight spread, clamped to the window
      (32,768; about 13% of documents sit at the cap). They are interactive,
      not batch: the seed's callers who "send enormous prompts" expect an
      answer now, and the point of the mix is that a 32K prefill must not
      trap the 200-token chats queued behind it. Output is a summary or an
      answer of a few hundred tokens.
    - batch: evals and backfills that soak leftover capacity, medium-sized
      (prompt median 2K, output median 500: longer generations than chat,
      which is where batch spends its decode steps).
    - shares: 10% documents carry about 80% of the tokens (one document's
      prompt is ~150 chats' prompts), so they hold most of the KV while chats
      are most of the requests; 15% batch is in the 10-20% that keeps
      leftover capacity busy without being the main load. Shares are
      weights, normalised over the three.
    - tenants: four, each class's requests spread uniformly over them, so
      per-tenant fairness and caps have more than one tenant to act on.

    No class carries a shared prefix: the seed says nothing of system
    prompts, and a study of prefix-aware placement builds its own classes.
    """
    tenants = tuple(tenants)
    arrivals: ArrivalProcess = Poisson(rate_per_s) if burst_factor == 1.0 else GammaBursty(rate_per_s, burst_factor)
    chat = RequestClass(
        name="chat", share=chat_share, service_class="interactive", tenants=tenants,
        prompt=LogNormal(median_tokens=200, sigma=0.8, min_tokens=8, max_tokens=4_096),
        output=LogNormal(median_tokens=150, sigma=0.8, min_tokens=1, max_tokens=1_024),
    )
    document = RequestClass(
        name="document", share=document_share, service_class="interactive", tenants=tenants,
        prompt=LogNormal(median_tokens=31_000, sigma=0.05, min_tokens=16_384, max_tokens=32_768),
        output=LogNormal(median_tokens=300, sigma=0.5, min_tokens=16, max_tokens=1_024),
    )
    batch = RequestClass(
        name="batch", share=batch_share, service_class="batch", tenants=tenants,
        prompt=LogNormal(median_tokens=2_000, sigma=0.6, min_tokens=64, max_tokens=8_192),
        output=LogNormal(median_tokens=500, sigma=0.6, min_tokens=16, max_tokens=2_048),
    )
    return Workload(arrivals=arrivals, classes=(chat, document, batch))
