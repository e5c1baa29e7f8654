"""Where the scheduler learns its replicas' addresses: a fixed list (static.py) for
local runs, or the per-version Services' EndpointSlices (endpoint_slices.py)."""
