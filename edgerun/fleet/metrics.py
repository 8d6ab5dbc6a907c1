"""The server's Prometheus metrics (prometheus_client), one registry per app, served at `GET /metrics`.

One process, one set of series: with `fleet serve --workers N` each scrape reaches one worker, so run one
process per replica (and several replicas behind the load balancer) when every series must add up.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "FleetMetrics"]


class FleetMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.checkins = Counter("edgerun_fleet_checkins", "Device check-ins answered, by answer",
                                ["answer"], registry=r)
        self.reports = Counter("edgerun_fleet_reports", "Run reports received, by whether they were new",
                               ["result"], registry=r)
        self.refused = Counter("edgerun_fleet_requests_refused", "Requests refused by a rate limit, by scope",
                               ["scope"], registry=r)
        self.open_streams = Gauge("edgerun_fleet_open_streams", "Push streams open on this process", registry=r)
        self.leader = Gauge("edgerun_fleet_step_monitor_leader", "1 while this process runs the step monitor",
                            registry=r)
        self.monitor_ticks = Counter("edgerun_fleet_step_monitor_ticks", "Step monitor rounds run as leader",
                                     registry=r)
        self.push_checks = Counter("edgerun_fleet_push_checks", "Open streams asked whether a release change "
                                   "makes their device out of date", registry=r)
        self.push_nudges = Counter("edgerun_fleet_push_nudges", "Open streams nudged to check in", registry=r)
        self.draining = Gauge("edgerun_fleet_draining", "1 once this process is shutting down", registry=r)
        self.db_pool_in_use = Gauge("edgerun_fleet_db_connections_in_use", "Database connections checked out",
                                    registry=r)

    def watch_pool(self, checked_out: Callable[[], int]) -> None:
        self.db_pool_in_use.set_function(lambda: float(checked_out()))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
