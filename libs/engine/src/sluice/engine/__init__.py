"""The pure engine core of a replica: paged KV bookkeeping and the iteration
scheduler. No torch, no asyncio, no I/O; the clock is passed in. The replica
service, unit tests and (later) the simulator drive the same code:

    plan = scheduler.schedule(now_s)        # which tokens run this step
    sampled = runner.execute(plan)          # the model (torch) runs them
    outputs = scheduler.update(plan, sampled)
"""
