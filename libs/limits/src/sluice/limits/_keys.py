"""Redis key names, shared by the Redis-backed stores.

    {prefix}:{kind}:{<len(tenant)>:<tenant>}:{suffix}

The tenant is length-prefixed so no two (tenant, suffix) pairs collide
(tenant "a:b" + key "c" vs tenant "a" + key "b:c"), and sits inside a
Redis Cluster hash tag so every key of one tenant lands in one slot, which
multi-key Lua scripts need.
"""

from __future__ import annotations

import math


def tenant_key(prefix: str, kind: str, tenant: str, suffix: str) -> str:
    return f"{prefix}:{kind}:{{{len(tenant)}:{tenant}}}:{suffix}"


def to_ms(seconds: float) -> int:
    """A positive whole number of milliseconds for PX / PEXPIRE."""
    return max(1, math.ceil(seconds * 1000))


def clock_arg(clock) -> str:
    """ARGV for "now": the caller's clock, or '' to use Redis TIME in the script.

    repr() of a float round-trips exactly, so the script sees the same
    number the in-process implementation would."""
    return "" if clock is None else repr(float(clock()))


# The script side of `clock_arg`: every script takes "now" as ARGV[1].
LUA_NOW = """
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""
