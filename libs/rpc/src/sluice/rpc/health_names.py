"""Health names for readiness conditions, beside the per-service names.

The plain service name ("sluice.v1.Router") and "" say the process is up.
These say whether it can do its job right now, so readiness can follow the
whole route gateway -> router -> scheduler -> a ready replica.
"""

# Scheduler: at least one replica reports ready (its canary passed).
SCHEDULER_HAS_READY_REPLICA = "sluice.readiness.scheduler.ready_replica"
# Router: its placement stream is open and the scheduler has a ready replica.
ROUTER_HAS_ROUTE = "sluice.readiness.router.route"
