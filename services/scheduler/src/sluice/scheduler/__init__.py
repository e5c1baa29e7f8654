"""The scheduler service: places requests onto replicas from their state
streams and keeps the per-replica reservation ledger. It carries no tokens:
its load grows with requests, not with tokens."""
