"""The quality gate: the candidate against the serving version on a fixed prompt set."""
