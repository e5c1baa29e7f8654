"""The pure engine core of a replica: paged KV bookkeeping with a prefix
cache (block_manager, block_hash), the waiting line (waiting) and the
iteration scheduler (scheduler). No torch, no asyncio, no I/O; the clock is
passed in. The replica service, unit tests and (later) the simulator drive
the same code:

    plan = scheduler.schedule(now_s)        # which tokens run this step
    sampled = runner.execute(plan)          # the model (torch) runs them
    outputs = scheduler.update(plan, sampled)
"""
