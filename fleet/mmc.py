"""The M/M/c queue (Erlang C) that the capacity plan (fleet/capacity.py) sizes the
interactive workers by: how often a request waits for a free worker core, and how long its
p99 wait is. Pure arithmetic on its own, so that its formulas are checked against known
values apart from the plan's."""

from __future__ import annotations

import math

SPARE_SDS = 12.0  # Halfin-Whitt's beta past which, with 1,000+ servers, no arrival waits


def erlang_c(servers: int, load: float) -> float:
    """The probability that an arrival waits in an M/M/c queue of `servers` servers offered
    `load` erlangs (arrival rate x service time); 1 when the queue is unstable. Computed
    through Erlang B's recursion, which stays finite for thousands of servers and costs a
    step per server. Past a thousand servers that exceed the load by SPARE_SDS standard
    deviations of it (Halfin and Whitt's beta), it is 0 without the recursion (the true
    value is below 2e-29 there): a plan for millions of requests a second needs millions
    of servers, and the recursion would run for minutes."""
    if load <= 0:
        return 0.0
    if load >= servers:
        return 1.0
    if servers > 1000 and (servers - load) / math.sqrt(load) >= SPARE_SDS:
        return 0.0
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    rho = load / servers
    return b / (1 - rho + rho * b)


def wait_quantile_s(servers: int, rate: float, service_s: float, q: float = 0.99) -> float:
    """The q-quantile of the time an M/M/c arrival waits before a server takes it: the
    wait is 0 with probability 1 - C, else exponential at rate c/S - rate, so
    P(W > t) = C exp(-(c/S - rate) t)."""
    load = rate * service_s
    if load >= servers:
        return math.inf
    waits = erlang_c(servers, load)
    if waits <= 1 - q:
        return 0.0
    return math.log(waits / (1 - q)) / (servers / service_s - rate)
