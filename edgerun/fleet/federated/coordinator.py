"""Driving a federated job's rounds on a real fleet (`edgerun fleet federated run`): the server side that
opens each round, invites the sampled devices, collects their updates and closes the round.

`RoundDriver.step(now)` is one tick, time given by the caller:

1. With no round open, the job samples its devices among those seen lately (rounds.py) and the round's
   invitation is published (publisher.invite): a signed release of the training task, version
   release_version(round), targeted at the sampled device ids, carrying the round's starting weights, the
   round and the seed, with `run_once` set to the round's record id. Each sampled device's standalone
   `edgerun fleet agent` installs it at its next check-in, runs it once on its data folder and its stream
   tunnel uploads the packed update to /v1/stream under that record id (stream/agent_hooks.py).
2. The records are read from /v1/stream a page at a time and offered to the job once each, each accepted
   update added to the round's running sum as it is read, and each page removed from the store once the
   job has recorded it (collector.py).
3. At quorum or past the deadline the round closes (aggregate, evaluate on the held-out set, publish or
   roll back). A rolled-back round leaves the global weights at the last good version, so the next
   round's invitation carries those. After the last round, the final weights go out as a plain release
   (no run_once) to the devices the job's targeting matches among those seen lately, and to every device
   it invited.

Everything the driver needs survives a restart: the job's state is in the fleet database, and an
invitation already published for the open round is found among the server's releases, not sent again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from edgerun.fleet.admin_client import AdminClient
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.collector import collect
from edgerun.fleet.federated.publisher import FleetPublisher, release_version
from edgerun.fleet.federated.rounds import FederatedJob, RoundResult
from edgerun.fleet.targeting import DeviceProfile, matches


class NoDeviceYet(FleetError):
    """No device the job may sample has checked in lately: nothing was opened; try again later."""


class RoundDriver:
    """Runs `job` among the fleet: `devices(now)` are the profiles to sample from (rounds.fleet_devices),
    `records()` the job's stream records (collector.fetch_records), `evaluate(weights)` the held-out metric."""

    def __init__(self, job: FederatedJob, publisher: FleetPublisher, admin: AdminClient,
                 devices: Callable[[float], Sequence[DeviceProfile]], records: Callable[[], Iterable[dict[str, Any]]],
                 evaluate: Callable[[dict[str, np.ndarray]], float]) -> None:
        self.job, self.publisher, self.admin = job, publisher, admin
        self.devices, self.records, self.evaluate = devices, records, evaluate
        self.sampled: dict[int, list[str]] = {}  # round -> the devices invited

    def running(self) -> bool:
        return bool(self.job.status()["status"] == "running")

    def _published(self, task_version: int) -> bool:
        return any(r["task"] == self.job.name and r["version"] == task_version for r in self.admin.releases())

    def step(self, now: float) -> RoundResult | None:
        """One tick; returns the round it closed, if it closed one. A job with no device to sample raises
        NoDeviceYet (one line) and opens nothing: the caller may try again once devices have checked in."""
        status = self.job.status()
        if status["status"] != "running":
            return None
        round_number = int(status["round"])
        if round_number not in self.sampled:
            try:  # the open round's sample if it is open already (a driver started again)
                sampled = self.job.open_round(self.devices(now), now)
            except FleetError as exc:  # the job is running, so what open_round refuses is the sample
                raise NoDeviceYet(str(exc)) from None
            if not self._published(release_version(round_number)):
                self.publisher.invite(round_number, self.job.config.seed, self.job.global_weights(), sampled)
            self.sampled[round_number] = sampled
        collect(self.job, self.records(), now)
        if not self.job.ready(now):
            return None
        result = self.job.close_round(self.evaluate)  # the next invitation ships the weights
        if self.job.status()["status"] == "done":
            # Kind "device", as the invitations: a device's most specific release wins (docs/fleet.md), so a
            # uniform one would never replace an invitation on the devices that took part.
            targeting = self.job.config.targeting
            final = {d.device_id for d in self.devices(now) if matches(targeting, d)}
            final.update(d for sampled in self.sampled.values() for d in sampled)
            self.publisher.final(release_version(result.round + 1), self.job.global_weights(), sorted(final))
        return result
