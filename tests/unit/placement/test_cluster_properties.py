"""Properties of ClusterScheduler under random traffic.

A state machine drives several replicas (random KV capacities and seats),
several tenants and owners, both classes, through enqueue / schedule /
started / release / cancel (a release with no output) / drop_owner /
time passing / replica reports, and checks after every step:

- interactive reservations never exceed a replica's KV blocks or seats;
- right after a schedule() that dispatched batch to a replica: batch +
  interactive reservations there are within its KV blocks and seats, batch
  holds at most batch_max_share of them if interactive work is in the pool,
  and the oldest queued interactive is no older than batch_pause_queue_age_s
  (headroom.py: batch only goes into KV nobody reserved);
- the ledger's per-replica and per-tenant sums equal the sums of its
  reservations, and its reservations are exactly the dispatched requests;
- every request gets exactly one answer (Refused at enqueue, or one
  Dispatched or Refused from schedule) unless it was cancelled while queued;
- after everything is released, cancelled or its owner dropped, the ledger
  and every queue are empty.

Then: the predicted start never falls when work is added ahead or running.
"""

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sluice.admission.kv import blocks_for
from sluice.admission.reservation import ReservationPolicy, reserve_for
from sluice.admission.tenant_caps import TenantLimits, TenantLimitsTable
from sluice.outcomes import Reason
from sluice.placement.asks import Dispatched, Queued, Refused
from sluice.placement.config import ClassPolicy

from placement_factories import BATCH, BLOCK, INTERACTIVE, UNCAPPED, make_ask, make_scheduler, make_view

TENANTS = ("a", "b", "c")
OWNERS = ("router-0", "router-1")
ENQUEUE_REASONS = {
    Reason.NO_REPLICA, Reason.REQUEST_TOO_LARGE, Reason.TENANT_CONCURRENCY, Reason.TENANT_KV_SHARE,
    Reason.QUEUE_FULL, Reason.OVER_CAPACITY,
}
ROOM = 2000
# small class defaults, so a request without max_tokens fits these small replicas
SMALL_DEFAULTS = ReservationPolicy(default_output_tokens_interactive=48, default_output_tokens_batch=96)
REPORT = st.tuples(st.floats(0.0, 1.0), st.sampled_from([True] * 7 + [False]))


class ClusterMachine(RuleBasedStateMachine):
    @initialize(
        replicas=st.lists(st.tuples(st.integers(24, 160), st.sampled_from([0, 3, 8])), min_size=1, max_size=3),
        share=st.sampled_from([0.25, 0.5, 1.0]), pause_s=st.sampled_from([0.0, 0.5, 5.0]),
        long_tokens=st.sampled_from([0, 200]), slo_s=st.sampled_from([1e9, 1e9, 30.0, 3.0]),
        wait_s=st.sampled_from([4.0, 1e9]), queue_length=st.sampled_from([4, 1000]),
        caps=st.sampled_from([UNCAPPED, UNCAPPED, TenantLimitsTable(
            default=TenantLimits(3, 0.5), overrides={"c": TenantLimits(100, 1.0)})]),
        drain_by_owner=st.booleans(), buffer=st.sampled_from([0.0, 0.25]),
    )
    def setup(self, replicas, share, pause_s, long_tokens, slo_s, wait_s, queue_length, caps, drain_by_owner,
              buffer):
        self.now = 0.0
        self.capacity = {f"r{i}": capacity for i, capacity in enumerate(replicas)}
        self.seen_at = {rid: 0.0 for rid in self.capacity}
        self.ready = {rid: True for rid in self.capacity}
        policy = ClassPolicy(ttft_slo_s=slo_s, max_queue_wait_s=wait_s, max_queue_length=queue_length)
        self.scheduler = make_scheduler(
            *(self._view(rid) for rid in self.capacity), interactive=policy, batch=policy, tenants=caps,
            batch_max_share=share, batch_pause_queue_age_s=pause_s, long_prompt_tokens=long_tokens,
            long_prefills_per_replica=1, reservation=replace(SMALL_DEFAULTS, buffer_fraction=buffer),
        )
        self.config = self.scheduler.config
        self.drain_by_owner = drain_by_owner
        self.asks = {}
        self.largest_at_enqueue = {}
        self.state = {}  # request id -> queued | dispatched | done | cancelled
        self.answers = Counter()
        self.enqueued_at = {}
        self.deadline = {}
        self.served = Counter()  # (class, tenant) -> weighted tokens really served
        self.next_id = 0

    def _view(self, rid, free=None):
        total, seats = self.capacity[rid]
        return make_view(rid, total=total, free=free, max_num_seqs=seats, ready=self.ready[rid],
                         seen_at_s=self.seen_at[rid])

    def _live(self):
        return [rid for rid in self.capacity
                if self.ready[rid] and self.now - self.seen_at[rid] <= self.config.stale_state_s]

    def _ids(self, *states):
        return sorted(i for i, s in self.state.items() if s in states)

    def _answer(self, request_id, outcome):
        assert self.answers[request_id] == 0, f"{request_id} answered twice"
        self.answers[request_id] += 1
        event(outcome)

    # -- rules ---------------------------------------------------------------

    @rule(burst=st.lists(st.tuples(
        st.sampled_from(TENANTS), st.booleans(), st.sampled_from(OWNERS),
        st.integers(1, 150) | st.integers(1, 150) | st.integers(150, 1200), st.integers(0, 100),
        st.none() | st.floats(0.1, 5.0)), min_size=1, max_size=5))
    def enqueue(self, burst):
        for ask in burst:
            self._enqueue(*ask)

    def _enqueue(self, tenant, batch, owner, prompt, max_tokens, deadline):
        request_id = f"q{self.next_id}"
        self.next_id += 1
        ask = make_ask(request_id, tenant=tenant, owner=owner, service_class=BATCH if batch else INTERACTIVE,
                       prompt=prompt, max_tokens=max_tokens, room=ROOM,
                       deadline_s=self.now + deadline if deadline else 0.0)
        self.asks[request_id] = ask
        # What a request reserves is clamped, at enqueue, to the largest
        # replica live then (it must fit one); one seen later does not grow it.
        self.largest_at_enqueue[request_id] = max((self.capacity[r][0] for r in self._live()), default=0)
        answer = self.scheduler.enqueue(ask, self.now)
        if isinstance(answer, Refused):
            assert answer.reason in ENQUEUE_REASONS, answer
            assert answer.retry_after_s >= 0
            live = self._live()
            assert (answer.reason is Reason.NO_REPLICA) == (not live)
            if live:
                largest = max(self.capacity[r][0] for r in live)
                never_fits = blocks_for(prompt + 1, BLOCK) > largest
                if never_fits:
                    assert answer.reason is Reason.REQUEST_TOO_LARGE
                elif answer.reason is Reason.REQUEST_TOO_LARGE:  # alone over the tenant's KV share
                    assert "this key may hold at most" in answer.message
            if answer.reason is Reason.OVER_CAPACITY:
                assert answer.retry_after_s > 0 and answer.predicted_start_s > self.config.interactive.ttft_slo_s
            self.state[request_id] = "done"
            self._answer(request_id, f"enqueue: {answer.reason}")
        else:
            assert isinstance(answer, Queued) and answer.predicted_start_s >= 0
            self.state[request_id] = "queued"
            self.enqueued_at[request_id] = self.now
            wait_s = self.config.class_policy(batch).max_queue_wait_s
            self.deadline[request_id] = min(self.now + wait_s, ask.deadline_s or float("inf"))

    @precondition(lambda self: self._ids("queued", "dispatched"))
    @rule(data=st.data(), action=st.sampled_from(
        ["started", "started", "release", "release", "cancel", "cancel-by-owner", "wrong-owner", "duplicate"]),
        fraction=st.floats(0.0, 1.5))
    def router_message(self, data, action, fraction):
        """Started / Release (output = fraction of its allowance) / cancel (a
        release with no output) / a release from another router stream / the
        same id enqueued again."""
        candidates = self._ids("dispatched") if action in ("started", "release") else self._ids("queued", "dispatched")
        if not candidates:
            return
        request_id = data.draw(st.sampled_from(candidates))
        ask = self.asks[request_id]
        if action == "started":
            self.scheduler.started(request_id, self.now)
        elif action == "release":
            self._release(request_id, int(fraction * self.scheduler.ledger.get(request_id).output_tokens))
        elif action.startswith("cancel"):
            self._release(request_id, 0, owner=ask.owner if action == "cancel-by-owner" else None)
        elif action == "wrong-owner":
            other = next(o for o in OWNERS if o != ask.owner)
            assert self.scheduler.release(request_id, 0, self.now, owner=other) is False
        else:
            answer = self.scheduler.enqueue(ask, self.now)
            assert isinstance(answer, Refused)
            assert answer.reason is (Reason.DUPLICATE_REQUEST if self._live() else Reason.NO_REPLICA)

    @rule()
    def schedule(self):
        live = set(self._live())
        long_before = self._long_prefilling()
        decisions = self.scheduler.schedule(self.now)
        batch_to = set()
        seen_batch = False
        for decision in decisions:
            assert self.state[decision.request_id] == "queued", "answered after it left the queue"
            ask = self.asks[decision.request_id]
            self._answer(decision.request_id, f"schedule: {getattr(decision, 'reason', ask.service_class.name)}")
            if isinstance(decision, Refused):
                assert decision.reason in (Reason.QUEUE_TIMEOUT, Reason.NO_REPLICA), decision
                assert decision.retry_after_s >= 0
                if decision.reason is Reason.QUEUE_TIMEOUT:
                    assert self.deadline[decision.request_id] <= self.now
                    assert decision.predicted_start_s is not None
                else:
                    assert not live
                self.state[decision.request_id] = "done"
                continue
            assert isinstance(decision, Dispatched) and decision.replica_id in live
            assert decision.owner == ask.owner
            expected = reserve_for(self.config.reservation, ask.prompt_tokens, ask.requested_output_tokens, ROOM,
                                   BLOCK, ask.service_class is BATCH).blocks
            assert decision.reserved_kv_blocks == min(expected, self.largest_at_enqueue[decision.request_id])
            self.state[decision.request_id] = "dispatched"
            self.served[(ask.service_class, ask.tenant)] += ask.prompt_tokens * self.config.vtc_input_weight
            if ask.service_class is BATCH:
                seen_batch = True
                batch_to.add(decision.replica_id)
            else:
                assert not seen_batch, "interactive dispatched after batch in one schedule()"
        # Past its deadline (or without a live replica) nothing stays queued.
        for request_id in self._ids("queued"):
            assert live and self.deadline[request_id] > self.now
        long_after = self._long_prefilling()
        if long_after > long_before:
            assert long_after <= self.config.long_prefills_per_replica * len(live)
        if batch_to:
            event("batch dispatched while interactive present" if self._check_batch_gates(batch_to, live)
                  else "batch dispatched alone")

    def _long_prefilling(self):
        return sum(1 for r in self.scheduler.ledger.reservations() if r.is_long and r.started_at_s is None)

    def _check_batch_gates(self, batch_to, live):
        queued_interactive = [i for i in self._ids("queued") if self.asks[i].service_class is INTERACTIVE]
        # While the long-prefill lane is full, a long prompt waits for the
        # lane, not for capacity: its age does not pause batch.
        lane_full = self._long_prefilling() >= self.config.long_prefills_per_replica * len(live)
        waiting_for_capacity = [
            i for i in queued_interactive
            if not (lane_full and self.config.long_prompt_tokens
                    and self.asks[i].prompt_tokens >= self.config.long_prompt_tokens)
        ]
        if waiting_for_capacity:
            oldest = min(self.enqueued_at[i] for i in waiting_for_capacity)
            assert self.now - oldest <= self.config.batch_pause_queue_age_s
        present = bool(queued_interactive) or any(
            self.scheduler.ledger.holding(r).seats[INTERACTIVE] for r in live)
        share = self.config.batch_max_share
        for rid in batch_to:
            total, seats = self.capacity[rid]
            holding = self.scheduler.ledger.holding(rid)
            assert holding.total_kv_blocks <= total, (rid, holding, total)
            if seats:
                assert holding.total_seats <= seats
            if present:
                assert holding.kv_blocks[BATCH] <= int(share * total)
                if seats:
                    assert holding.seats[BATCH] <= int(share * seats)
        return present

    def _release(self, request_id, output_tokens, owner=None):
        ask = self.asks[request_id]
        assert self.scheduler.release(request_id, output_tokens, self.now, owner=owner) is True
        if self.state[request_id] == "dispatched":
            self.served[(ask.service_class, ask.tenant)] += output_tokens * self.config.vtc_output_weight
            self.state[request_id] = "done"
        else:
            self.state[request_id] = "cancelled"

    @rule(owner=st.sampled_from(OWNERS))
    def drop_owner(self, owner):
        self._drop_owner(owner)

    def _drop_owner(self, owner):
        mine = [i for i in self._ids("queued", "dispatched") if self.asks[i].owner == owner]
        assert self.scheduler.drop_owner(owner) == len(mine)
        for request_id in mine:
            self.state[request_id] = "cancelled" if self.state[request_id] == "queued" else "done"

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0, 3.0]),
          reports=st.lists(st.none() | REPORT | REPORT | REPORT, min_size=3, max_size=3))
    def time_passes(self, seconds, reports):
        """Time moves on; each replica reports (free KV share, ready) or stays silent (None)."""
        self.now += seconds
        for rid, report in zip(sorted(self.capacity), reports):
            if report is None:
                continue
            free_share, ready = report
            self.ready[rid] = ready
            self.seen_at[rid] = self.now
            self.scheduler.observe_replica(self._view(rid, free=int(free_share * self.capacity[rid][0])))

    def _drain(self):
        if self.drain_by_owner:
            for owner in OWNERS:
                self._drop_owner(owner)
        else:
            for request_id in self._ids("queued", "dispatched"):
                self._release(request_id, 0 if self.state[request_id] == "queued" else 1)
        ledger = self.scheduler.ledger
        assert len(ledger) == 0 and ledger.reservations() == [] and ledger.reserved_kv_blocks() == {}
        for rid in self.capacity:
            assert ledger.holding(rid).kv_blocks == [0, 0] and ledger.holding(rid).seats == [0, 0]
        for queue in self.scheduler.queues().values():
            assert len(queue) == 0 and queue.kv_blocks == 0 and queue.tenant_work() == {}
        assert self.scheduler.tenant_holdings("v1") == {}

    def teardown(self):
        if not hasattr(self, "scheduler"):
            return
        self._drain()
        for request_id, state in self.state.items():
            # "cancelled" = released or dropped while still queued
            assert self.answers[request_id] == (0 if state == "cancelled" else 1), (request_id, state)

    # -- invariants ------------------------------------------------------------

    @invariant()
    def interactive_never_past_capacity(self):
        if not hasattr(self, "scheduler"):
            return
        for rid, (total, seats) in self.capacity.items():
            holding = self.scheduler.ledger.holding(rid)
            assert holding.kv_blocks[INTERACTIVE] <= total
            if seats:
                assert holding.seats[INTERACTIVE] <= seats

    @invariant()
    def ledger_sums_match_its_reservations(self):
        if not hasattr(self, "scheduler"):
            return
        ledger = self.scheduler.ledger
        reservations = ledger.reservations()
        assert sorted(r.request_id for r in reservations) == self._ids("dispatched")
        for rid in self.capacity:
            mine = [r for r in reservations if r.replica_id == rid]
            holding = ledger.holding(rid)
            for cls in (INTERACTIVE, BATCH):
                assert holding.kv_blocks[cls] == sum(r.kv_blocks for r in mine if r.service_class is cls)
                assert holding.seats[cls] == sum(1 for r in mine if r.service_class is cls)
        assert ledger.reserved_kv_blocks() == {
            rid: n for rid in self.capacity if (n := sum(r.kv_blocks for r in reservations if r.replica_id == rid))}
        for tenant in TENANTS:
            mine = [r for r in reservations if r.tenant == tenant]
            assert ledger.tenant_holding("v1", tenant) == (len(mine), sum(r.kv_blocks for r in mine))

    @invariant()
    def queues_hold_exactly_the_queued_requests(self):
        if not hasattr(self, "scheduler"):
            return
        queued = []
        for queue in self.scheduler.queues().values():
            entries = list(queue.entries())
            queued += [e.ask.request_id for e in entries]
            assert queue.kv_blocks == sum(e.kv_blocks for e in entries)
        assert sorted(queued) == self._ids("queued")

    @invariant()
    def served_tracks_what_was_generated(self):
        if not hasattr(self, "scheduler"):
            return
        for (cls, tenant), expected in self.served.items():
            counters = self.scheduler.queues()[("v1", cls)].counters
            assert abs(counters.served.get(tenant, 0.0) - expected) < 1e-6


ClusterMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestClusterMachine = ClusterMachine.TestCase


# -- the predicted start is monotone in the work ahead and running -----------------

# max_tokens 0 = the class default; mixed lengths once let short work ahead lower a prediction
ASKS = st.builds(
    lambda tenant, batch, prompt, max_tokens: make_ask(
        "", tenant=tenant, service_class=BATCH if batch else INTERACTIVE, prompt=prompt, max_tokens=max_tokens),
    st.sampled_from(TENANTS), st.booleans(), st.integers(1, 300), st.sampled_from([0, 1, 16, 64, 300]))
# what happens to a request dispatched at 0: (started at, (released that much later, with output tokens)),
# either may be None; all before t=1 (the clock never goes back: Started comes before Release)
LIFE = st.tuples(st.none() | st.floats(0.0, 0.5), st.none() | st.tuples(st.floats(0.0, 0.5), st.integers(0, 300)))


@st.composite
def pools(draw):
    """A recipe: replicas, work dispatched at t=0 (some started, some
    finished), and work queued at t=1. `build(extra)` replays it, optionally
    dispatching one more request at t=1 before the queued work arrives."""
    views = [make_view(f"r{i}", total=draw(st.integers(40, 120)), max_num_seqs=draw(st.sampled_from([0, 2, 4])),
                       step_time_s=draw(st.sampled_from([0.0, 0.02])))
             for i in range(draw(st.integers(1, 3)))]
    share = draw(st.sampled_from([0.5, 1.0]))
    running = draw(st.lists(st.tuples(ASKS, LIFE), max_size=14))
    queued = draw(st.lists(ASKS, max_size=10))

    def build(extra=None):
        scheduler = make_scheduler(*views, batch_max_share=share, reservation=SMALL_DEFAULTS)
        for n, (ask, (started_s, finished)) in enumerate(running):
            scheduler.enqueue(replace(ask, request_id=f"run{n}"), 0.0)
            for decision in scheduler.schedule(0.0):
                if started_s is not None:
                    scheduler.started(decision.request_id, started_s)
                if finished is not None:
                    scheduler.release(decision.request_id, finished[1], (started_s or 0.0) + finished[0])
            scheduler.release(f"run{n}", 0, 0.0)  # what did not fit leaves: the queue is empty at t=1
        if extra is not None:
            scheduler.enqueue(replace(extra, request_id="extra"), 1.0)
            if not scheduler.schedule(1.0):
                return None
        for n, ask in enumerate(queued):
            assume(isinstance(scheduler.enqueue(replace(ask, request_id=f"queued{n}"), 1.0), Queued))  # tenant KV cap
        return scheduler

    return views, build


def probe(data, views):
    return (data.draw(st.sampled_from([INTERACTIVE, BATCH])), data.draw(st.sampled_from(TENANTS)),
            data.draw(st.integers(1, min(v.total_kv_blocks for v in views))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools(), st.data())
def test_more_work_ahead_never_lowers_the_prediction(pool, data):
    views, build = pool
    scheduler = build()
    probe_class, tenant, kv_blocks = probe(data, views)
    before = scheduler.predict_start_delay_s("v1", probe_class, tenant, kv_blocks, 1.5)
    ahead = data.draw(ASKS)
    if probe_class is INTERACTIVE:  # batch is not ahead of interactive
        ahead = replace(ahead, service_class=INTERACTIVE)
    assume(isinstance(scheduler.enqueue(replace(ahead, request_id="ahead"), 1.5), Queued))
    after = scheduler.predict_start_delay_s("v1", probe_class, tenant, kv_blocks, 1.5)
    event("waits" if before > 0 else "fits now")
    assert 0.0 <= before <= after + 1e-9, (before, after)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools(), ASKS, st.data())
def test_more_running_work_never_lowers_the_prediction(pool, extra, data):
    """The same pool with one more request dispatched (by schedule()) at t=1."""
    views, build = pool
    busier = build(extra)
    if busier is None:
        event("extra did not fit")
        return
    scheduler = build()
    probe_class, tenant, kv_blocks = probe(data, views)
    before = scheduler.predict_start_delay_s("v1", probe_class, tenant, kv_blocks, 1.5)
    after = busier.predict_start_delay_s("v1", probe_class, tenant, kv_blocks, 1.5)
    event("waits" if before > 0 else "fits now")
    assert 0.0 <= before <= after + 1e-9, (before, after)
