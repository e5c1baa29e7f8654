"""The cluster scheduler's core: queues, fairness, admission and dispatch.

    enqueue(ask, now)  ─▶ Refused (never fits, tenant cap, queue full,
                          predicted start past the class SLO)  or  Queued
    schedule(now)      ─▶ [Dispatched | Refused (deadline passed)]
    started / release / cancel / drop_owner     the router's messages
    observe_replica / observe_cache / forget_replica   replicas' state

Per model-version pool: one ClassQueue per class (interactive served
before batch; within a class, fair by VTC). Batch is gated: none while the
oldest interactive has queued past `batch_pause_queue_age_s`, and at most
`batch_max_share` of a replica while interactive work is in the pool.
"Queued" there, and in the overload signals, means waiting for KV or
seats: a long prompt held back only because the long-prefill lane is full
waits for the lane, which its own admission prices (`_long_lane_delay_s`),
and batch work could not give it the lane sooner.

Each pool has an OverloadController (sluice.admission.overload) fed by
`schedule`; its stage adds levers to `enqueue` (batch paused, output
capped, routed to the fallback version, early rejection). Critical
tenants skip the levers and keep a reserve of KV, seats and queue places.

Pure: no I/O, no asyncio, every method takes the clock. Only the scheduler
service (or the simulator) calls it, from one thread.
"""

from collections import defaultdict, deque
from dataclasses import dataclass

from sluice.admission.kv import blocks_for
from sluice.admission.overload import OverloadController, OverloadStage, PoolSignals, StageChange
from sluice.admission.prediction import (
    PoolCapacity,
    PromisedReturns,
    RetrySlots,
    RunningWork,
    ServiceTimeEstimate,
    WorkAhead,
    predict_start_delay_s,
)
from sluice.admission.reservation import reserve_for
from sluice.admission.tenant_caps import TenantHolding, check_tenant_caps
from sluice.outcomes import Reason
from sluice.placement.asks import Ask, Dispatched, Queued, Refused, ServiceClass
from sluice.placement.class_queue import ClassQueue, QueueEntry
from sluice.placement.config import PlacementConfig
from sluice.placement.headroom import Headroom, headroom, seats_of
from sluice.placement.overload_levers import Lever, choose_lever
from sluice.placement.reservations import ReplicaHolding
from sluice.placement.prefix_index import PrefixIndex
from sluice.placement.replica_choice import Candidate, ReplicaView, pick
from sluice.placement.reservations import Reservation, ReservationLedger
from sluice.placement.vtc import VirtualTokenCounters

# Grants this recent may not show in a replica's report yet (the request is
# still on its way to the replica): counted against its reported free blocks.
REPORT_TRANSIT_S = 0.1
NO_REPLICA_RETRY_S = 1.0
# A refused request is told to return when its predicted start is this
# share of the SLO inside it (see _capacity_retry_after_s).
RETRY_SLO_MARGIN = 0.25
# Tenants with a spread of retry slots remembered; past it, spent ones are dropped.
MAX_TENANT_RETRY_SLOTS = 10_000
# A pool's overload signals are sampled at most this often: the prediction
# walks every reservation, and the stage holds are far longer than this.
OVERLOAD_SAMPLE_INTERVAL_S = 0.1
# Interactive arrivals' predicted starts feed the overload signal for this
# long: a pool that refuses every arrival at its SLO has no queue to age,
# and is overloaded all the same.
ARRIVAL_WINDOW_S = 1.0


@dataclass(slots=True)
class PrefixStats:
    """Placement's prefix-cache effectiveness, in blocks."""

    queried_blocks: int = 0
    hit_blocks: int = 0


class ClusterScheduler:
    def __init__(self, config: PlacementConfig) -> None:
        self.config = config
        self.ledger = ReservationLedger()
        self.prefix = PrefixIndex()
        self.prefix_stats = PrefixStats()
        self._views: dict[str, ReplicaView] = {}
        self._queues: dict[tuple[str, ServiceClass], ClassQueue] = {}
        self._service: dict[str, ServiceTimeEstimate] = defaultdict(ServiceTimeEstimate)
        # (version, class): refused requests told when to come back, until then.
        self._promised: dict[tuple[str, ServiceClass], PromisedReturns] = defaultdict(PromisedReturns)
        # (version, tenant, class): a tenant at its cap told to come back
        # one at a time, as its own requests finish.
        self._tenant_retry_slots: dict[tuple[str, str, ServiceClass], RetrySlots] = {}
        self._recent_grants: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._last_granted_s: dict[str, float] = {}
        self._overload: dict[str, OverloadController] = {}
        self._overload_sampled_s: dict[str, float] = {}
        self._arrival_predictions: dict[str, deque[tuple[float, float]]] = defaultdict(deque)  # (at_s, delay_s)
        # Stage changes since the caller last took them (it logs them):
        # `schedule` appends, the caller clears.
        self.stage_changes: list[tuple[str, StageChange]] = []

    # -- replicas ------------------------------------------------------------

    def observe_replica(self, view: ReplicaView) -> None:
        self._views[view.replica_id] = view

    def observe_cache(self, replica_id: str, stored: list[bytes], evicted: list[bytes], snapshot: bool) -> None:
        self.prefix.apply(replica_id, stored, evicted, snapshot)

    def forget_replica(self, replica_id: str) -> None:
        self._views.pop(replica_id, None)
        self.prefix.forget(replica_id)
        self._recent_grants.pop(replica_id, None)
        self._last_granted_s.pop(replica_id, None)

    def replicas(self) -> list[ReplicaView]:
        return list(self._views.values())

    def live_replicas(self, model_version: str, now_s: float) -> list[ReplicaView]:
        return [
            v for v in self._views.values()
            if v.model_version == model_version and v.ready and now_s - v.seen_at_s <= self.config.stale_state_s
        ]

    # -- the router's messages -------------------------------------------------

    def enqueue(self, ask: Ask, now_s: float) -> Queued | Refused:
        version = ask.model_version
        views = self.live_replicas(version, now_s)
        if not views:
            return self._refuse(ask, Reason.NO_REPLICA, f"No ready replica serves {version}.", NO_REPLICA_RETRY_S)
        if ask.request_id in self.ledger or self._queued_entry(ask.request_id) is not None:
            return self._refuse(ask, Reason.DUPLICATE_REQUEST, "This request id is already placed.", 0.0)
        is_batch = ask.service_class is ServiceClass.BATCH
        block_size = views[0].block_size_tokens
        largest = max(v.total_kv_blocks for v in views)
        if blocks_for(ask.prompt_tokens + 1, block_size) > largest:
            return self._refuse(
                ask, Reason.REQUEST_TOO_LARGE,
                f"The prompt is {ask.prompt_tokens} tokens; one replica of {version} holds at most "
                f"{largest * block_size} tokens of KV cache. Shorten the messages.", 0.0,
            )
        stage = self.overload_stage(version)
        output_cap_tokens = 0
        if not ask.critical and stage > OverloadStage.NORMAL:
            lever = self._apply_levers(ask, stage, now_s)
            if not isinstance(lever, tuple):
                return lever
            ask, output_cap_tokens = lever
        reservation = reserve_for(
            self.config.reservation, ask.prompt_tokens, ask.requested_output_tokens,
            ask.max_output_tokens, block_size, is_batch,
        )
        kv_blocks = min(reservation.blocks, largest)
        pool_blocks = sum(v.total_kv_blocks for v in views)
        limits = self.config.tenants.for_tenant(ask.tenant)
        # Per class: a tenant's batch work is preemptible by everyone's
        # interactive, so it must not use up the tenant's interactive share.
        holding = self._tenant_holding(version, ask.tenant, ask.service_class)
        breach = check_tenant_caps(limits, holding, kv_blocks, pool_blocks)
        if breach is not None:
            retry_s = 0.0 if breach.reason is Reason.REQUEST_TOO_LARGE else self._tenant_retry_after_s(ask, now_s)
            return self._refuse(ask, breach.reason, breach.message, retry_s)
        policy = self.config.class_policy(is_batch)
        queue = self._queue(version, ask.service_class)
        delay_s = self.predict_start_delay_s(
            version, ask.service_class, ask.tenant, kv_blocks, now_s, ask.critical, reservation.output_tokens)
        if not is_batch:
            # For the overload signal: the wait for capacity. A long prompt's
            # wait for the lane is its own (see _oldest_interactive_waiting_s).
            self._arrival_predictions[version].append((now_s, delay_s))
        is_long = bool(self.config.long_prompt_tokens) and ask.prompt_tokens >= self.config.long_prompt_tokens
        if is_long:
            delay_s = max(delay_s, self._long_lane_delay_s(version, ask.service_class, len(views), now_s))
        # The last places of each queue are the critical tenants' reserve.
        queue_places = policy.max_queue_length - (0 if ask.critical else self.config.overload.critical_queue_slots)
        if len(queue) >= queue_places or delay_s > policy.ttft_slo_s:
            reason = Reason.QUEUE_FULL if len(queue) >= queue_places else Reason.OVER_CAPACITY
            retry_s = self._capacity_retry_after_s(
                ask, kv_blocks, reservation.output_tokens, delay_s, policy.ttft_slo_s, now_s)
            message = (
                f"The {'batch' if is_batch else 'interactive'} queue of {version} is full "
                f"({queue_places} requests)."
                if reason is Reason.QUEUE_FULL else self._over_capacity_message(ask, delay_s, policy.ttft_slo_s)
            )
            return self._refuse(ask, reason, message, retry_s, delay_s)
        early_bound_s = self.config.overload.reject_predicted_start_s
        if stage >= OverloadStage.REJECTING and not ask.critical and not is_batch and delay_s > early_bound_s:
            retry_s = self._capacity_retry_after_s(
                ask, kv_blocks, reservation.output_tokens, delay_s, early_bound_s, now_s)
            return self._refuse(
                ask, Reason.OVER_CAPACITY,
                f"{version} is overloaded: requests that cannot start within {early_bound_s:.1f}s are refused "
                f"until it recovers (this one would wait about {delay_s:.1f}s).", retry_s, delay_s,
            )
        deadline_s = now_s + policy.max_queue_wait_s
        if ask.deadline_s:
            deadline_s = min(deadline_s, ask.deadline_s)
        queue.push(QueueEntry(ask, now_s, deadline_s, kv_blocks, reservation.output_tokens, is_long, output_cap_tokens))
        return Queued(ask.request_id, delay_s, version)

    def _apply_levers(self, ask: Ask, stage: OverloadStage, now_s: float) -> tuple[Ask, int] | Queued | Refused:
        """The overload stage's lever for a request that is not critical: a
        refusal, the request queued in its fallback pool, or the ask to
        queue here with its output cap (0 = none)."""
        version, levers = ask.model_version, self.config.overload
        choice = choose_lever(ask, stage, levers, self.overload_stage(ask.fallback_model_version))
        if choice.lever is Lever.FALLBACK:
            routed = self.enqueue(choice.ask, now_s)
            if isinstance(routed, Queued):
                return routed
            # The fallback cannot take it either: this pool's other levers apply.
            choice = choose_lever(ask, stage, levers, OverloadStage.REJECTING)
        if choice.lever is Lever.PAUSE_BATCH:
            resume_s = self._overload[version].resume_in_s(OverloadStage.BATCH_PAUSED, now_s)
            return self._refuse(
                ask, Reason.BATCH_PAUSED,
                f'{version} is overloaded: batch-class calls (service_tier "flex") are paused, expected to '
                f"resume in about {resume_s:.0f}s. Interactive calls are still served.",
                self._stage_retry_after_s(ask, resume_s, now_s),
            )
        if choice.lever is Lever.REFUSE_LONG_PROMPT:
            resume_s = self._overload[version].resume_in_s(OverloadStage.OUTPUT_CAPPED, now_s)
            return self._refuse(
                ask, Reason.OVER_CAPACITY,
                f"{version} is overloaded: prompts of {levers.degraded_prompt_tokens} tokens or more are not "
                f"taken from this key until it recovers (this one is {ask.prompt_tokens}).",
                self._stage_retry_after_s(ask, resume_s, now_s),
            )
        return choice.ask, choice.output_cap_tokens

    def _stage_retry_after_s(self, ask: Ask, resume_s: float, now_s: float) -> float:
        """A lever's refusal: come back once the stage is expected to have
        lifted, and behind those refused before it (as any refusal)."""
        is_batch = ask.service_class is ServiceClass.BATCH
        views = self.live_replicas(ask.model_version, now_s)
        reservation = reserve_for(
            self.config.reservation, ask.prompt_tokens, ask.requested_output_tokens,
            ask.max_output_tokens, views[0].block_size_tokens, is_batch,
        )
        kv_blocks = min(reservation.blocks, max(v.total_kv_blocks for v in views))
        slo_s = self.config.class_policy(is_batch).ttft_slo_s
        return self._capacity_retry_after_s(
            ask, kv_blocks, reservation.output_tokens, 0.0, slo_s, now_s, at_least_s=resume_s)

    def started(self, request_id: str, now_s: float) -> None:
        reservation = self.ledger.mark_started(request_id, now_s)
        if reservation is not None:
            estimate = self._service[reservation.model_version]
            if reservation.is_long:
                estimate.observe_long_prefill(now_s - reservation.granted_at_s, reservation.prompt_tokens)
            else:
                estimate.observe_first_token(now_s - reservation.granted_at_s)

    def release(self, request_id: str, output_tokens: int, now_s: float, owner: str | None = None) -> bool:
        """The request ended (or left its queue). False if unknown."""
        reservation = self.ledger.release(request_id, owner)
        if reservation is None:
            return self._dequeue(request_id, owner) is not None
        counters = self._queue(reservation.model_version, reservation.service_class).counters
        counters.settle_release(reservation.tenant, reservation.output_tokens, output_tokens)
        if reservation.started_at_s is not None:
            estimate = self._service[reservation.model_version]
            estimate.observe_decode(now_s - reservation.started_at_s, output_tokens, reservation.output_tokens,
                                    self._occupancy(reservation))
            if not reservation.is_long:  # a long prompt's first token is the lane's estimate, not this one
                predicted_s = reservation.predicted_first_token_s + output_tokens * reservation.predicted_per_token_s
                estimate.observe_lateness(now_s - reservation.granted_at_s, predicted_s, output_tokens)
        return True

    def _occupancy(self, released: Reservation) -> float:
        """How full `released`'s replica was as it ended (itself included):
        the larger of its seat and KV shares. 1.0 when the replica is gone."""
        view = self._views.get(released.replica_id)
        if view is None:
            return 1.0
        held = self.ledger.holding(released.replica_id)
        seats = (held.total_seats + 1) / seats_of(view)
        blocks = (held.total_kv_blocks + released.kv_blocks) / max(view.total_kv_blocks, 1)
        return max(seats, blocks)

    def drop_owner(self, owner: str) -> int:
        """A router stream broke: everything it queued or held goes."""
        released = self.ledger.release_owner(owner)
        for reservation in released:
            self._queue(reservation.model_version, reservation.service_class).counters.abandon(reservation.tenant)
        dropped = len(released)
        for queue in self._queues.values():
            for entry in queue.entries():
                if entry.ask.owner == owner:
                    queue.remove(entry.ask.request_id)
                    dropped += 1
        return dropped

    # -- dispatch ------------------------------------------------------------

    def schedule(self, now_s: float) -> list[Dispatched | Refused]:
        decisions: list[Dispatched | Refused] = []
        for version in sorted({version for version, _ in self._queues}):
            views = self.live_replicas(version, now_s)
            self._observe_overload(version, views, now_s)
            self._expire(version, views, now_s, decisions)
            if not views:
                continue
            self._dispatch_class(version, ServiceClass.INTERACTIVE, views, now_s, decisions)
            if not self._batch_paused(version, views, now_s):
                self._dispatch_class(version, ServiceClass.BATCH, views, now_s, decisions)
        return decisions

    def _dispatch_class(
        self, version: str, service_class: ServiceClass, views: list[ReplicaView], now_s: float,
        decisions: list[Dispatched | Refused],
    ) -> None:
        queue = self._queues.get((version, service_class))
        if not queue:
            return
        long_cap = self._long_lanes(len(views))
        long_prefilling = self._long_prefilling(version)
        while queue:
            def may_go(e: QueueEntry) -> bool:
                return not e.is_long or long_prefilling < long_cap

            entry = queue.next_entry(may_go)
            if entry is None:
                return
            chosen = self._place(entry, version, views)
            if chosen is None and not entry.ask.critical:
                # The fairest head waits for capacity and nobody else jumps
                # it, except a critical request, which may use the reserve
                # the head may not.
                entry = queue.next_entry(lambda e: e.ask.critical and may_go(e))
                chosen = None if entry is None else self._place(entry, version, views)
            if entry is None or chosen is None:
                return
            queue.remove(entry.ask.request_id)
            decisions.append(self._grant(entry, chosen, queue.counters, now_s))
            long_prefilling += entry.is_long

    def _place(self, entry: QueueEntry, version: str, views: list[ReplicaView]) -> Candidate | None:
        interactive_present = self._interactive_present(version, views)
        candidates = [self._candidate(view, entry, interactive_present) for view in views]
        return pick(candidates, entry.kv_blocks, self.config.prefix_load_margin)

    def _grant(self, entry: QueueEntry, chosen: Candidate, counters: VirtualTokenCounters, now_s: float) -> Dispatched:
        ask, view = entry.ask, chosen.view
        estimate = self._service[ask.model_version]
        self.ledger.reserve(Reservation(
            request_id=ask.request_id, owner=ask.owner, tenant=ask.tenant, model_version=ask.model_version,
            replica_id=view.replica_id, service_class=ask.service_class, prompt_tokens=ask.prompt_tokens,
            output_tokens=entry.output_tokens, kv_blocks=entry.kv_blocks, is_long=entry.is_long, granted_at_s=now_s,
            critical=ask.critical, output_cap_tokens=entry.output_cap_tokens,
            predicted_first_token_s=estimate.time_to_first_token_s(),
            predicted_per_token_s=estimate.per_output_token_s(view.step_time_s),
        ))
        self._recent_grants[view.replica_id].append((now_s, entry.kv_blocks))
        self._last_granted_s[view.replica_id] = now_s
        counters.charge_dispatch(ask.tenant, ask.prompt_tokens, entry.output_tokens)
        self.prefix_stats.queried_blocks += chosen.prompt_blocks
        self.prefix_stats.hit_blocks += chosen.matched_prefix_blocks
        return Dispatched(
            request_id=ask.request_id, owner=ask.owner, replica_id=view.replica_id, address=view.address,
            reserved_kv_blocks=entry.kv_blocks, queued_s=now_s - entry.enqueued_s,
            cached_prefix_blocks=chosen.matched_prefix_blocks, model_version=ask.model_version,
            output_cap_tokens=entry.output_cap_tokens,
        )

    def _candidate(self, view: ReplicaView, entry: QueueEntry, interactive_present: bool) -> Candidate:
        room = self._headroom(view, entry.ask.service_class, interactive_present, entry.ask.critical)
        same_blocks = self.config.prefix_aware and entry.ask.block_size_tokens == view.block_size_tokens
        hashes = entry.ask.prompt_block_hashes if same_blocks else ()
        return Candidate(
            view=view, headroom_kv_blocks=room.kv_blocks, headroom_seats=room.seats, load=room.load,
            matched_prefix_blocks=self.prefix.matched_blocks(view.replica_id, hashes), prompt_blocks=len(hashes),
            last_granted_s=self._last_granted_s.get(view.replica_id, float("-inf")),
        )

    def _headroom(
        self, view: ReplicaView, service_class: ServiceClass, interactive_present: bool, critical: bool = False
    ) -> Headroom:
        holding = self.ledger.holding(view.replica_id)
        reserve_kv_blocks, reserve_seats = (0, 0) if critical else self._critical_reserve(view, holding)
        return headroom(
            view, holding, self._unseen_kv_blocks(view), service_class, interactive_present,
            self.config.batch_max_share, reserve_kv_blocks, reserve_seats,
        )

    def _critical_reserve(self, view: ReplicaView, holding: ReplicaHolding) -> tuple[int, int]:
        """What of the replica's critical reserve critical tenants do not
        hold yet: (KV blocks, seats) nobody else may take."""
        share = self.config.overload.critical_kv_reserve_share
        if not share:
            return 0, 0
        blocks = max(0, int(share * view.total_kv_blocks) - holding.critical_kv_blocks)
        seats = max(0, int(share * view.max_num_seqs) - holding.critical_seats) if view.max_num_seqs else 0
        return blocks, seats

    def _unseen_kv_blocks(self, view: ReplicaView) -> int:
        grants = self._recent_grants.get(view.replica_id)
        if not grants:
            return 0
        visible_before_s = view.seen_at_s - REPORT_TRANSIT_S
        while grants and grants[0][0] <= visible_before_s:
            grants.popleft()
        return sum(blocks for _, blocks in grants)

    def _expire(self, version: str, views: list[ReplicaView], now_s: float, decisions: list) -> None:
        for service_class in ServiceClass:
            queue = self._queues.get((version, service_class))
            if not queue:
                continue
            for entry in queue.entries():
                if views and entry.deadline_s > now_s:
                    continue
                queue.remove(entry.ask.request_id)
                if not views:
                    decisions.append(self._refuse(
                        entry.ask, Reason.NO_REPLICA, f"No ready replica serves {version}.", NO_REPLICA_RETRY_S))
                    continue
                policy = self.config.class_policy(service_class is ServiceClass.BATCH)
                delay_s = self.predict_start_delay_s(
                    version, service_class, entry.ask.tenant, entry.kv_blocks, now_s, output_tokens=entry.output_tokens)
                retry_s = self._capacity_retry_after_s(
                    entry.ask, entry.kv_blocks, entry.output_tokens, delay_s, policy.ttft_slo_s, now_s)
                decisions.append(self._refuse(
                    entry.ask, Reason.QUEUE_TIMEOUT,
                    f"The request waited {now_s - entry.enqueued_s:.1f}s in the queue without reaching a replica.",
                    retry_s, delay_s,
                ))

    def _batch_paused(self, version: str, views: list[ReplicaView], now_s: float) -> bool:
        oldest_s = self._oldest_interactive_waiting_s(version, views)
        return oldest_s is not None and now_s - oldest_s > self.config.batch_pause_queue_age_s

    def _oldest_interactive_waiting_s(self, version: str, views: list[ReplicaView]) -> float | None:
        """When the oldest interactive entry waiting for capacity was
        enqueued. While the long-prefill lane is full, its long prompts wait
        for the lane, not for capacity: at a load the pool carries, a 32K
        document waits seconds for it behind another one, and counting that
        wait paused batch and walked the overload stages up to rejecting
        (in the 70B simulation, at one request a second)."""
        interactive = self._queues.get((version, ServiceClass.INTERACTIVE))
        if not interactive:
            return None
        if self._long_prefilling(version) < self._long_lanes(len(views)):
            return interactive.oldest_enqueued_s()
        return interactive.oldest_enqueued_s(lambda e: not e.is_long)

    def _long_lanes(self, num_replicas: int) -> int:
        return self.config.long_prefills_per_replica * num_replicas

    def _long_prefilling(self, version: str) -> int:
        """Long prompts dispatched to the pool and not yet at their first token."""
        return sum(
            1 for r in self.ledger.reservations() if r.model_version == version and r.is_long and r.started_at_s is None
        )

    def _interactive_present(self, version: str, views: list[ReplicaView]) -> bool:
        interactive = self._queues.get((version, ServiceClass.INTERACTIVE))
        if interactive:
            return True
        return any(self.ledger.holding(v.replica_id).seats[ServiceClass.INTERACTIVE] for v in views)

    # -- prediction ------------------------------------------------------------

    def predict_start_delay_s(
        self, version: str, service_class: ServiceClass, tenant: str, kv_blocks: int, now_s: float,
        critical: bool = False, output_tokens: int = 0, also_ahead: WorkAhead = WorkAhead(0, 0),
    ) -> float:
        """Seconds until a request of `kv_blocks` (and `output_tokens` of
        output bound) from `tenant` would be dispatched if it joined its
        queue now, behind `also_ahead` besides the queue."""
        ahead_blocks, ahead_seqs = self._work_ahead(version, service_class, tenant, kv_blocks)
        needed = WorkAhead(ahead_blocks + also_ahead.kv_blocks + kv_blocks, ahead_seqs + also_ahead.seqs + 1)
        return self._predict_delay_s(version, service_class, needed, now_s, critical, output_tokens)

    def _predict_delay_s(
        self, version: str, service_class: ServiceClass, needed: WorkAhead, now_s: float, critical: bool,
        output_tokens: int = 0,
    ) -> float:
        views = self.live_replicas(version, now_s)
        if not views:
            return 0.0
        # Without the batch share cap: it is transient policy, and with it a
        # running interactive request would look like capacity batch regains.
        rooms = [self._headroom(v, service_class, False, critical) for v in views]
        capacity = PoolCapacity(
            total_kv_blocks=sum(v.total_kv_blocks for v in views),
            total_seats=sum(seats_of(v) for v in views),
            # Unclamped: an overbooked replica (negative room) must free more first.
            free_kv_blocks=sum(r.kv_blocks for r in rooms),
            free_seats=sum(r.seats for r in rooms),
        )
        estimate = self._service[version]
        step_time_s = max(v.step_time_s for v in views)
        per_token_s = estimate.per_output_token_s(step_time_s)
        running: list[RunningWork] = []
        for r in self.ledger.reservations():
            if r.model_version != version:
                continue
            if service_class is ServiceClass.INTERACTIVE and r.service_class is ServiceClass.BATCH:
                continue  # interactive may displace batch: batch does not hold it back
            start_s = r.started_at_s if r.started_at_s is not None else r.granted_at_s + estimate.time_to_first_token_s()
            # Work past its expected finish is still running: it finishes
            # no sooner than its next token.
            finish_s = max(start_s + r.output_tokens * per_token_s, now_s + per_token_s)
            running.append(RunningWork(finish_s, r.kv_blocks))
        mean_service_s = estimate.mean_service_s(
            self.config.reservation.default_output_tokens_interactive, step_time_s, output_tokens)
        return predict_start_delay_s(now_s, capacity, needed, running, mean_service_s)

    def _long_lane_delay_s(self, version: str, service_class: ServiceClass, num_replicas: int, now_s: float) -> float:
        """When a long prompt joining now would get a place in the pool's
        long-prefill lane: the lane's places drain the long prompts
        prefilling and those queued ahead (all of a more important class,
        all of its own: VTC orders them, the lane is first come per turn),
        each taking its measured lane time per prompt token."""
        estimate = self._service[version]
        lanes = self._long_lanes(num_replicas)
        prefilling = [
            max(0.0, r.granted_at_s + estimate.long_prefill_s(r.prompt_tokens) - now_s)
            for r in self.ledger.reservations()
            if r.model_version == version and r.is_long and r.started_at_s is None
        ]
        ahead_s = 0.0
        for queued_class in ServiceClass:
            if queued_class > service_class:
                break
            queue = self._queues.get((version, queued_class))
            if queue:
                ahead_s += sum(estimate.long_prefill_s(e.ask.prompt_tokens) for e in queue.entries() if e.is_long)
        if len(prefilling) < lanes and not ahead_s:
            return 0.0
        return (sum(prefilling) + ahead_s) / lanes

    def _work_ahead(self, version: str, service_class: ServiceClass, tenant: str, kv_blocks: int) -> tuple[int, int]:
        """Queued work that would be dispatched before this request: all of a
        more important class, and of its own class what VTC interleaves
        ahead of it (from each other tenant about as much as this tenant
        has queued, plus the request itself)."""
        blocks, seqs = 0, 0
        if service_class is ServiceClass.BATCH:
            interactive = self._queues.get((version, ServiceClass.INTERACTIVE))
            if interactive:
                blocks, seqs = interactive.kv_blocks, len(interactive)
        queue = self._queues.get((version, service_class))
        if not queue:
            return blocks, seqs
        work = queue.tenant_work()
        own_seqs, own_blocks = work.pop(tenant, (0, 0))
        blocks += own_blocks
        seqs += own_seqs
        for other_seqs, other_blocks in work.values():
            blocks += min(other_blocks, own_blocks + kv_blocks)
            seqs += min(other_seqs, own_seqs + 1)
        return blocks, seqs

    def _capacity_retry_after_s(
        self, ask: Ask, kv_blocks: int, output_tokens: int, delay_s: float, slo_s: float, now_s: float,
        at_least_s: float = 0.0,
    ) -> float:
        """When a request refused now would be admitted: once its predicted
        start, behind the queue and behind everyone refused before it who
        was told to come back sooner, is well inside the SLO (and no sooner
        than `at_least_s`, an overload stage's expected end). The time is
        promised: it is work ahead of the next refusal's advice."""
        version, service_class = ask.model_version, ask.service_class
        promised = self._promised[(version, service_class)]
        ahead = promised.outstanding(now_s)
        if ahead.seqs:
            delay_s = max(delay_s, self.predict_start_delay_s(
                version, service_class, ask.tenant, kv_blocks, now_s, ask.critical, output_tokens, ahead))
        views = self.live_replicas(version, now_s)
        total_blocks = sum(v.total_kv_blocks for v in views) or 1
        total_seats = sum(seats_of(v) for v in views) or 1
        step_time_s = max((v.step_time_s for v in views), default=0.0)
        service_s = self._service[version].mean_service_s(
            self.config.reservation.default_output_tokens_interactive, step_time_s, output_tokens
        )
        # The soonest anyone refused is told to return: its share of the
        # pool's turnover (a refusal never says "now": the work that
        # refused it is still there).
        soonest_s = service_s * max(kv_blocks / total_blocks, 1 / total_seats)
        # Aim inside the bound the retry will meet, not at its edge: a retry
        # told to come back when its predicted start is exactly the bound is
        # refused again by any drift of the prediction, about half the time.
        # An interactive refusal for capacity means the pool is overloaded,
        # and the overload stages soon tighten the bound to
        # `reject_predicted_start_s` (SLO / 4 by default): a retry aimed at
        # the SLO would come back into that stage and be refused again.
        levers = self.config.overload
        if levers.policy.enabled and service_class is ServiceClass.INTERACTIVE and not ask.critical:
            slo_s = min(slo_s, levers.reject_predicted_start_s)
        # And by how much the pool's predictions have run late: a herd told
        # to come back at the predicted instant is refused again whenever
        # the work ahead runs a few percent over its prediction.
        delay_s *= self._service[version].late_factor()
        wait_s = max(delay_s - (1.0 - RETRY_SLO_MARGIN) * slo_s, soonest_s, at_least_s)
        promised.promise(now_s + wait_s, kv_blocks)
        return wait_s

    def _tenant_retry_after_s(self, ask: Ask, now_s: float) -> float:
        """When the tenant's own running work of this class is expected to
        free a place for this request. Refusals in a row are spread, one
        per expected finish (the tenant's n running requests of mean
        duration S free one every S / n): a herd of the tenant's callers
        all told "at the next finish" would come back together, one get
        in, and the rest be refused again."""
        estimate = self._service[ask.model_version]
        finishes = [
            (r.started_at_s if r.started_at_s is not None else r.granted_at_s + estimate.time_to_first_token_s())
            + r.output_tokens * estimate.per_output_token_s()
            for r in self.ledger.reservations()
            if r.model_version == ask.model_version and r.tenant == ask.tenant
            and r.service_class is ask.service_class
        ]
        service_s = estimate.mean_service_s(self.config.reservation.default_output_tokens_interactive)
        if not finishes:  # all of it is queued: it frees a place once one starts and finishes
            fits_at_s, spacing_s = now_s + service_s, service_s
        else:
            fits_at_s = max(min(finishes), now_s + estimate.per_output_token_s())
            spacing_s = service_s / len(finishes)
        key = (ask.model_version, ask.tenant, ask.service_class)
        slots = self._tenant_retry_slots.get(key)
        if slots is None:
            if len(self._tenant_retry_slots) >= MAX_TENANT_RETRY_SLOTS:
                self._tenant_retry_slots = {
                    k: v for k, v in self._tenant_retry_slots.items() if v.next_slot_s > now_s
                }
            slots = self._tenant_retry_slots[key] = RetrySlots()
        return slots.retry_after_s(now_s, fits_at_s, spacing_s)

    # -- overload ------------------------------------------------------------

    def overload_stage(self, version: str) -> OverloadStage:
        controller = self._overload.get(version)
        return OverloadStage.NORMAL if controller is None else controller.stage

    def overload_signals(self, version: str) -> PoolSignals | None:
        controller = self._overload.get(version)
        return None if controller is None else controller.signals

    def _observe_overload(self, version: str, views: list[ReplicaView], now_s: float) -> None:
        if now_s - self._overload_sampled_s.get(version, float("-inf")) < OVERLOAD_SAMPLE_INTERVAL_S:
            return
        self._overload_sampled_s[version] = now_s
        controller = self._overload.get(version)
        if controller is None:
            controller = self._overload[version] = OverloadController(self.config.overload.policy)
        change = controller.observe(self._pool_signals(version, views, now_s), now_s)
        if change is not None:
            self.stage_changes.append((version, change))

    def _pool_signals(self, version: str, views: list[ReplicaView], now_s: float) -> PoolSignals:
        if not views:
            return PoolSignals(0.0, 0.0, 0.0)
        interactive = self._queues.get((version, ServiceClass.INTERACTIVE))
        oldest_s = self._oldest_interactive_waiting_s(version, views)
        queued_blocks, queued_seqs = (interactive.kv_blocks, len(interactive)) if interactive else (0, 0)
        held_blocks = sum(self.ledger.holding(v.replica_id).kv_blocks[ServiceClass.INTERACTIVE] for v in views)
        # The longest predicted start of the interactive arrivals of the last
        # ARRIVAL_WINDOW_S (queued or refused), and of a typical chat (its
        # output's worth of blocks) joining behind the queued ones: how long
        # demand is kept waiting. A pool that is full but has nobody arriving
        # or waiting is busy, not overloaded, and batch keeps queueing for
        # what it leaves.
        arrivals = self._arrival_predictions[version]
        while arrivals and arrivals[0][0] < now_s - ARRIVAL_WINDOW_S:
            arrivals.popleft()
        predicted_s = max((delay_s for _, delay_s in arrivals), default=0.0)
        if queued_seqs:
            nominal_blocks = blocks_for(
                self.config.reservation.default_output_tokens_interactive, views[0].block_size_tokens)
            predicted_s = max(predicted_s, self._predict_delay_s(
                version, ServiceClass.INTERACTIVE, WorkAhead(queued_blocks + nominal_blocks, queued_seqs + 1), now_s,
                critical=False,
            ))
        return PoolSignals(
            interactive_queue_age_s=0.0 if oldest_s is None else now_s - oldest_s,
            predicted_start_s=predicted_s,
            kv_occupancy=(held_blocks + queued_blocks) / max(1, sum(v.total_kv_blocks for v in views)),
        )

    # -- views for metrics ---------------------------------------------------

    def queues(self) -> dict[tuple[str, ServiceClass], ClassQueue]:
        return dict(self._queues)

    def tenant_holdings(self, version: str) -> dict[str, TenantHolding]:
        tenants = {r.tenant for r in self.ledger.reservations() if r.model_version == version}
        for service_class in ServiceClass:
            queue = self._queues.get((version, service_class))
            if queue:
                tenants.update(queue.tenant_work())
        return {t: self._tenant_holding(version, t) for t in tenants}

    def pool_kv_blocks(self, version: str, now_s: float) -> int:
        return sum(v.total_kv_blocks for v in self.live_replicas(version, now_s))

    # -- internals -----------------------------------------------------------

    def _queue(self, version: str, service_class: ServiceClass) -> ClassQueue:
        queue = self._queues.get((version, service_class))
        if queue is None:
            counters = VirtualTokenCounters(self.config.vtc_input_weight, self.config.vtc_output_weight)
            queue = self._queues[(version, service_class)] = ClassQueue(counters)
        return queue

    def _queued_entry(self, request_id: str) -> tuple[ClassQueue, QueueEntry] | None:
        for queue in self._queues.values():
            entry = queue.get(request_id)
            if entry is not None:
                return queue, entry
        return None

    def _dequeue(self, request_id: str, owner: str | None) -> QueueEntry | None:
        found = self._queued_entry(request_id)
        if found is None:
            return None
        queue, entry = found
        if owner is not None and entry.ask.owner != owner:
            return None
        return queue.remove(request_id)

    def _tenant_holding(
        self, version: str, tenant: str, service_class: ServiceClass | None = None
    ) -> TenantHolding:
        """Queued + reserved, in one class or in all."""
        seqs, blocks = self.ledger.tenant_holding(version, tenant, service_class)
        for queued_class in ServiceClass if service_class is None else (service_class,):
            queue = self._queues.get((version, queued_class))
            if queue:
                queued_seqs, queued_blocks = queue.tenant_queued(tenant)
                seqs += queued_seqs
                blocks += queued_blocks
        return TenantHolding(active_seqs=seqs, kv_blocks=blocks)

    def _over_capacity_message(self, ask: Ask, delay_s: float, slo_s: float) -> str:
        message = (
            f"{ask.model_version} is at capacity: this request would wait about {delay_s:.1f}s to start "
            f"(the target for its class is {slo_s:.1f}s)."
        )
        if ask.service_class is ServiceClass.INTERACTIVE and self.config.long_prompt_tokens and (
            ask.prompt_tokens >= self.config.long_prompt_tokens
        ):
            message += ' For long prompts that can wait, send service_tier: "flex".'
        return message

    @staticmethod
    def _refuse(ask: Ask, reason: Reason, message: str, retry_after_s: float, predicted_s: float | None = None) -> Refused:
        return Refused(ask.request_id, ask.owner, reason, message, retry_after_s, predicted_s)
