"""Every refusal and failure reason, defined once.

Each reason says how it travels (a gRPC status name, so this package needs
no grpc), what HTTP status the gateway answers with, and whether a retry
may help. Hops pass a reason through unchanged; none translates another's
strings. Pure data: the policy cores import it too.
"""

from sluice.outcomes.reasons import OUTCOMES, Outcome, Reason, outcome_of

__all__ = ["OUTCOMES", "Outcome", "Reason", "outcome_of"]
