"""`sluice top`: the fleet's signals in a terminal.

Scrapes the scheduler's, the router's, the gateway's and every replica's
/metrics twice, `interval` apart, and shows what an SRE looks at first
(queue age by class, TTFT and ITL percentiles, tokens per second, KV
occupancy per replica, top tenants, rejections by reason, overload stage).

    exposition  parse a /metrics page into samples (pure)
    targets     which /metrics pages to read (flags, env, local defaults)
    scrape      read them all concurrently; a failed one is "down"
    quantile    histogram_quantile over bucket deltas (pure)
    model       the view model: frozen rows, None for "n/a"
    view        the view model from two scrapes and the time between (pure)
    render      rich tables from the view model
    cli         `sluice top`
"""
