"""The capacity planner: the smallest fleet (replicas x TP degree x GPU type)
that meets the SLOs at a given arrival rate, and what it costs.

    for each GPU type, each TP degree the model's weights fit on:
        probe 1, 2, 4, ... replicas until one meets the SLOs (max_replicas is
        probed last), then bisect between the last miss and the first hit
    the cheapest shape's smallest fleet wins (cost per hour; ties: fewer GPUs,
    then the lower cost per million output tokens)

The search assumes that more replicas never make a fleet miss SLOs it met
with fewer (monotone in replicas): it is what lets a bisection stand in for
probing every count. The simulator's fleets are deterministic for a seed
and their placement only spreads the same requests wider, so it holds up to
the noise of which request lands where; a count at the boundary can come out
one too high, never one too low against the probes actually run.

Meeting the SLOs, over one simulated run of the workload (`SloTargets`):

    interactive   the share of interactive requests that finished with
                  TTFT <= ttft_s + ttft_per_1k_prompt_tokens_s x prompt / 1,000
                  and TPOT (mean time per output token after the first) <= tpot_s
                  (and, when max_itl_s is set, no gap between two of its tokens
                  longer than that) is at least `attainment`. A refused
                  request is a miss.
    batch         the share of batch requests that finished with TTFT <=
                  batch_ttft_s is at least `batch_attainment` (default 0.9).
                  A refused one (batch_paused, ...) is a miss. The tolerance
                  is wider than interactive's because pausing batch during an
                  interactive burst is the overload controller's first lever,
                  a paused call comes back after its Retry-After (which the
                  simulation does not replay), and a run holds few batch
                  requests (~45 in 300 s at 1 request/s); a fleet that sheds
                  batch steadily still fails it.

The stall bound (max_itl_s, off by default) is for streams that must not
freeze: a mean TPOT hides one long gap among many short ones (a 200-token
chat that waits 2 s once, while a 32K prompt prefills in one step, still
averages ~40 ms a token). Sarathi-Serve's SLOs are of this kind, on the
tail of the time between tokens.

The per-1K allowance exists because a long prompt's TTFT is mostly its own
prefill: a 32K-token document takes over 2 s to prefill on 8 Hopper GPUs
with nothing else running, so "TTFT <= 2 s" cannot hold for it on any fleet
and would make every candidate miss. 0 (the default) keeps the flat target.

Saturation: when doubling the replicas raised none of the failing shares by
`min_gain` and the larger fleet showed no sign of load (under `min_gain` of
its requests refused for capacity or held in the scheduler's queue past a
tenth of their TTFT target), the misses are not caused by load
(requests that miss on an idle fleet) and the shape's search stops, naming
the best shares it reached. (Replicas' busy time is no such sign: a replica
that decodes anything at all is busy every step.)

Cost: price per GPU-hour x GPUs per hour, and per million tokens at the
simulated throughput: tokens of finished requests over the arrival window
(not the run's drain tail), which at a fleet that keeps up is the offered
load.

The search (`plan`) takes the simulation as a callable, so it is tested with
a fake; `Scenario` is the real one, built as `sluice sim` builds its run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sluice.outcomes import Reason
from sluice.placement.config import PlacementConfig

from sluice.sim.cost_model import CostModel
from sluice.sim.hardware import hardware_by_name
from sluice.sim.model_spec import ModelSpec
from sluice.sim.policies import build_policy, gpu_engine_config, slo_placement
from sluice.sim.results import RequestRecord, SimResults, Slo, class_slos
from sluice.sim.simulator import FleetSpec, Simulation
from sluice.sim.workload import SimRequest


@dataclass(frozen=True, slots=True)
class Fleet:
    gpu: str
    tp: int
    replicas: int

    @property
    def num_gpus(self) -> int:
        return self.tp * self.replicas

    def __str__(self) -> str:
        return f"{self.replicas} x {self.tp} x {self.gpu}"


@dataclass(frozen=True, slots=True)
class SloTargets:
    ttft_s: float = 2.0
    tpot_s: float = 0.1
    attainment: float = 0.99
    ttft_per_1k_prompt_tokens_s: float = 0.0
    batch_ttft_s: float = 600.0
    batch_attainment: float = 0.9
    max_itl_s: float = 0.0  # the longest gap between two tokens a request may see; 0 = no bound

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0 or self.batch_ttft_s <= 0:
            raise ValueError("SLO targets must be > 0")
        if self.max_itl_s < 0:
            raise ValueError("max_itl_s must be >= 0 (0 = no bound)")
        if not (0 <= self.attainment <= 1 and 0 <= self.batch_attainment <= 1):
            raise ValueError("attainment shares must be in [0, 1]")
        if self.ttft_per_1k_prompt_tokens_s < 0:
            raise ValueError("ttft_per_1k_prompt_tokens_s must be >= 0")

    def class_slos(self) -> dict[str, Slo]:
        """The same targets as `summarize` takes them (what `sluice sim` reports)."""
        return class_slos(self.ttft_s, self.tpot_s, self.batch_ttft_s,
                          ttft_per_1k_prompt_tokens_s=self.ttft_per_1k_prompt_tokens_s, max_itl_s=self.max_itl_s)


@dataclass(frozen=True, slots=True)
class Probe:
    """What one simulated run of a fleet measured, as the planner judges it.
    A share is 1.0 for a class with no requests."""

    interactive_attainment: float
    batch_attainment: float
    interactive_goodput_rps: float  # interactive requests that met their targets, per second of arrivals
    output_tokens_per_s: float      # finished requests' output tokens over the arrival window
    total_tokens_per_s: float       # the same with their prompts
    # Requests refused for capacity (a prompt past the context is refused on
    # any fleet) or held in the scheduler's queue past a tenth of their TTFT
    # target: what more replicas would relieve.
    delayed_share: float = 0.0
    wall_s: float = 0.0


def measure(results: SimResults, targets: SloTargets, window_s: float) -> Probe:
    """A run's `Probe`; `window_s` is the span the requests arrived over."""
    window_s = max(window_s, 1e-9)
    slos = targets.class_slos()
    met = {"interactive": 0, "batch": 0}
    count = {"interactive": 0, "batch": 0}
    output_tokens = total_tokens = delayed = 0
    for record in results.records:
        count[record.service_class] += 1
        met[record.service_class] += slos[record.service_class].met_by(record)
        if record.outcome == "finished":
            output_tokens += record.tokens
            total_tokens += record.tokens + record.prompt_tokens
        delayed += _delayed(record, slos[record.service_class])

    def share(service_class: str) -> float:
        return met[service_class] / count[service_class] if count[service_class] else 1.0

    return Probe(
        interactive_attainment=share("interactive"), batch_attainment=share("batch"),
        interactive_goodput_rps=met["interactive"] / window_s, output_tokens_per_s=output_tokens / window_s,
        total_tokens_per_s=total_tokens / window_s,
        delayed_share=delayed / len(results.records) if results.records else 0.0,
        wall_s=results.wall_s,
    )


def _delayed(record: RequestRecord, slo: Slo) -> bool:
    """`slo`: the targets of the record's class."""
    if record.outcome == "refused":
        return record.reason != Reason.CONTEXT_LENGTH_EXCEEDED.value
    queue_s = record.queue_s
    return queue_s is None or queue_s > 0.1 * slo.ttft_target_s(record.prompt_tokens)


def meets(probe: Probe, targets: SloTargets) -> bool:
    return probe.interactive_attainment >= targets.attainment and probe.batch_attainment >= targets.batch_attainment


@dataclass(frozen=True, slots=True)
class SearchSpace:
    gpus: tuple[str, ...] = ("h100", "h200")
    tps: tuple[int, ...] = (1, 2, 4, 8)
    max_replicas: int = 32
    # A doubling that raises no failing share by this much, on a fleet that
    # delayed under this share of its requests, ends a shape's search: half
    # a point of attainment is above the noise of which request lands where,
    # and a fleet that delays nobody is not short of replicas.
    min_gain: float = 0.005

    def __post_init__(self) -> None:
        if not self.gpus or not self.tps:
            raise ValueError("the search needs at least one GPU type and one TP degree")
        if self.max_replicas < 1 or any(tp < 1 for tp in self.tps):
            raise ValueError("max_replicas and every TP degree must be >= 1")


@dataclass(frozen=True, slots=True)
class Attempt:
    fleet: Fleet
    probe: Probe
    meets: bool


@dataclass(frozen=True, slots=True)
class FleetCost:
    fleet: Fleet
    probe: Probe
    price_per_gpu_hour: float
    cost_per_hour: float
    cost_per_million_output_tokens: float | None  # None: the run finished no tokens
    cost_per_million_tokens: float | None

    @classmethod
    def of(cls, fleet: Fleet, probe: Probe, price_per_gpu_hour: float) -> FleetCost:
        cost_per_hour = price_per_gpu_hour * fleet.num_gpus

        def per_million(tokens_per_s: float) -> float | None:
            return cost_per_hour / (tokens_per_s * 3600 / 1e6) if tokens_per_s > 0 else None

        return cls(fleet, probe, price_per_gpu_hour, cost_per_hour,
                   per_million(probe.output_tokens_per_s), per_million(probe.total_tokens_per_s))


# How a shape's search ended.
MET, NOT_MET, SATURATED, DOES_NOT_FIT = "met", "not met", "saturated", "does not fit"


@dataclass(frozen=True, slots=True)
class ShapeOutcome:
    """One (gpu, tp): its smallest fleet meeting the SLOs, if any, and every probe run."""

    gpu: str
    tp: int
    status: str  # MET | NOT_MET (up to max_replicas) | SATURATED | DOES_NOT_FIT
    note: str
    attempts: tuple[Attempt, ...] = ()
    choice: FleetCost | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    shapes: tuple[ShapeOutcome, ...]
    best: FleetCost | None  # the cheapest choice; None when no shape met the SLOs

    @property
    def probes_run(self) -> int:
        return sum(len(shape.attempts) for shape in self.shapes)


def plan(
    space: SearchSpace, targets: SloTargets, prices: Mapping[str, float],
    fits: Callable[[str, int], str | None], simulate: Callable[[Fleet], Probe],
    on_attempt: Callable[[Attempt], None] | None = None,
) -> Plan:
    """Search every shape of `space`. `fits(gpu, tp)` is None where the model
    fits, else why not; `simulate(fleet)` runs one candidate;
    `prices[gpu]` is its price per GPU-hour."""
    shapes = []
    for gpu in space.gpus:
        for tp in space.tps:
            reason = fits(gpu, tp)
            if reason is not None:
                shapes.append(ShapeOutcome(gpu, tp, DOES_NOT_FIT, reason))
                continue
            shapes.append(search_shape(gpu, tp, space, targets, prices[gpu], simulate, on_attempt))
    choices = [shape.choice for shape in shapes if shape.choice is not None]
    best = min(choices, key=_cheapness, default=None)
    return Plan(tuple(shapes), best)


def _cheapness(choice: FleetCost) -> tuple:
    # Cost per hour first: every candidate serves the same arrivals. Then
    # fewer GPUs; then the one that served more tokens for the money (it
    # refused fewer); the names last, so a tie always resolves the same way.
    per_million = choice.cost_per_million_output_tokens
    return (choice.cost_per_hour, choice.fleet.num_gpus, float("inf") if per_million is None else per_million,
            choice.fleet.gpu, choice.fleet.tp)


def search_shape(
    gpu: str, tp: int, space: SearchSpace, targets: SloTargets, price_per_gpu_hour: float,
    simulate: Callable[[Fleet], Probe], on_attempt: Callable[[Attempt], None] | None = None,
) -> ShapeOutcome:
    """The smallest replica count of one shape that meets `targets`:
    exponential probing from 1, then bisection (monotone in replicas)."""
    attempts: dict[int, Attempt] = {}

    def attempt(replicas: int) -> Attempt:
        fleet = Fleet(gpu, tp, replicas)
        probe = simulate(fleet)
        result = attempts[replicas] = Attempt(fleet, probe, meets(probe, targets))
        if on_attempt is not None:
            on_attempt(result)
        return result

    def outcome(status: str, note: str, hit: Attempt | None = None) -> ShapeOutcome:
        choice = None if hit is None else FleetCost.of(hit.fleet, hit.probe, price_per_gpu_hour)
        return ShapeOutcome(gpu, tp, status, note, tuple(attempts[n] for n in sorted(attempts)), choice)

    last_miss: Attempt | None = None
    replicas = 1
    while True:
        current = attempt(replicas)
        if current.meets:
            break
        if last_miss is not None and _saturated(last_miss.probe, current.probe, targets, space):
            return outcome(SATURATED, f"doubling to {replicas} replicas gained under {space.min_gain:.1%} with "
                                      f"nothing queued: misses not caused by load; best {_shares(current.probe)}")
        last_miss = current
        if replicas >= space.max_replicas:
            return outcome(NOT_MET, f"not met up to {space.max_replicas} replicas; best {_shares(current.probe)}")
        replicas = min(2 * replicas, space.max_replicas)
    low, high = (0 if last_miss is None else last_miss.fleet.replicas), replicas
    while high - low > 1:
        middle = (low + high) // 2
        if attempt(middle).meets:
            high = middle
        else:
            low = middle
    below = attempts.get(high - 1)
    binding = "" if below is None else f"; {high - 1} missed on {_failing(below.probe, targets)}"
    return outcome(MET, f"{len(attempts)} probes{binding}", attempts[high])


def _failing(probe: Probe, targets: SloTargets) -> str:
    failing = [name for name, share, target in (
        ("interactive", probe.interactive_attainment, targets.attainment),
        ("batch", probe.batch_attainment, targets.batch_attainment)) if share < target]
    return " and ".join(failing)


def _saturated(smaller: Probe, larger: Probe, targets: SloTargets, space: SearchSpace) -> bool:
    if larger.delayed_share >= space.min_gain:
        return False
    gains = []
    if larger.interactive_attainment < targets.attainment:
        gains.append(larger.interactive_attainment - smaller.interactive_attainment)
    if larger.batch_attainment < targets.batch_attainment:
        gains.append(larger.batch_attainment - smaller.batch_attainment)
    return all(gain < space.min_gain for gain in gains)


def _shares(probe: Probe) -> str:
    return f"interactive {probe.interactive_attainment:.1%}, batch {probe.batch_attainment:.1%}"


# -- the real simulation of one candidate -----------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    """What every candidate is simulated against, built as `sluice sim`
    builds its run: the production policies' configs with the interactive
    admission at `targets.ttft_s`, the replica's CUDA engine settings."""

    model: ModelSpec
    requests: tuple[SimRequest, ...]
    window_s: float
    targets: SloTargets = SloTargets()
    dtype: str = "bf16"
    block_size_tokens: int = 16
    # Cost models by (gpu, tp), built on first use: a cache, the only state.
    _costs: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError("the workload has no requests in that duration")

    def with_requests(self, requests: Sequence[SimRequest], window_s: float) -> Scenario:
        return replace(self, requests=tuple(requests), window_s=window_s, _costs=self._costs)

    def cost_model(self, gpu: str, tp: int) -> CostModel:
        key = (gpu, tp)
        if key not in self._costs:
            self._costs[key] = CostModel(hardware_by_name(gpu), self.model, tp=tp, dtype=self.dtype)
        return self._costs[key]

    def fits(self, gpu: str, tp: int) -> str | None:
        try:
            self.cost_model(gpu, tp).kv_capacity_blocks(self.block_size_tokens)
        except ValueError as error:
            return str(error)
        return None

    def placement(self) -> PlacementConfig:
        return slo_placement(self.targets.ttft_s, self.targets.batch_ttft_s)

    def summary_slos(self) -> dict[str, Slo]:
        """The targets the search judged by, as `sluice sim`'s summary takes them."""
        return self.targets.class_slos()

    def simulate(self, fleet: Fleet, policy: str = "sluice",
                 progress: Callable[[float, int], None] | None = None) -> SimResults:
        cost = self.cost_model(fleet.gpu, fleet.tp)
        spec = FleetSpec(
            fleet.replicas, cost.kv_capacity_blocks(self.block_size_tokens),
            build_policy(policy, gpu_engine_config(self.model), self.placement()), model_version=self.model.name,
            block_size_tokens=self.block_size_tokens, max_context_tokens=self.model.max_context_tokens,
        )
        return Simulation(spec, cost.step_time_s, list(self.requests), progress).run()

    def probe(self, fleet: Fleet, policy: str = "sluice") -> tuple[Probe, SimResults]:
        results = self.simulate(fleet, policy)
        return measure(results, self.targets, self.window_s), results


def parse_prices(items: Iterable[str], gpus: Iterable[str]) -> dict[str, float]:
    """Per-GPU-hour prices: each preset's own, overridden by `gpu=price`
    items (several may share one item, comma-separated)."""
    prices = {gpu: hardware_by_name(gpu).price_per_hour for gpu in gpus}
    for item in items:
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = part.partition("=")
            try:
                price = float(value)
            except ValueError:
                price = -1.0
            if not sep or price < 0:
                raise ValueError(f"a price is gpu=dollars-per-gpu-hour (h100=2.5), got {part!r}")
            prices[hardware_by_name(name).name] = price
    return prices
