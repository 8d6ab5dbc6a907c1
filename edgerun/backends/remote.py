"""The remote backend: a device running `edgerun serve` becomes one more backend of a local program.

Named `remote:HOST:PORT`; credentials come from the environment: EDGERUN_TOKEN, and/or the CURVE key files
named by EDGERUN_SERVER_KEY and EDGERUN_CLIENT_KEY (or `RemoteBackend(url, token=..., server_key=...,
client_key=...)` registered under a name of your choosing). Each partition is sent to the device as a program file, compiled there by the
device's own backends, and called with its inputs inline; outputs come back in the same round trip.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph

PREFIX = "remote:"


class RemoteBackend(Backend):
    extra = "remote"
    # A loopback round trip is ~0.1 ms and bulk transfer ~1 GB/s (bench/remote_throughput.py); a real link is
    # slower, which only makes the search keep more work local.
    throughput = Throughput(transfer_bytes_per_s=1e9, transfer_latency_s=2e-4)

    def __init__(self, url: str, token: str | None = None, *, name: str | None = None,
                 device_backends: Sequence[str] | None = None, timeout: float = 60.0,
                 server_key: str | os.PathLike[str] | None = None,
                 client_key: str | os.PathLike[str] | None = None) -> None:
        from edgerun.remote.client import connect

        self.name = name or f"{PREFIX}{url.removeprefix('tcp://')}"  # type: ignore[misc]
        self.device = connect(url, token, timeout=timeout, server_key=server_key, client_key=client_key)
        self.device_backends = list(device_backends) if device_backends else None
        # What the device can run is what its backends declare; shape/dtype limits are checked there.
        self.supported = {op: OpSupport() for op in self.device.info["ops"]}  # type: ignore[misc]
        self._uploaded = 0

    def compile(self, subgraph: Graph) -> CompiledPartition:
        from edgerun.program import Program

        self._uploaded += 1
        name = f"partition_{self._uploaded}"
        self.device.upload(Program(graph=subgraph), name=name, backends=self.device_backends)
        fn = self.device.function(name)

        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            results = fn(*inputs, fetch=True)
            for dst, src in zip(outputs, results):
                np.copyto(dst, src)

        return CompiledPartition(self.name, subgraph, run, info={"device": self.device.url, "function": name})


def create_remote_backend(name: str) -> RemoteBackend:
    """The backend for a registry name `remote:HOST:PORT`, with credentials from the environment."""
    address = name[len(PREFIX):]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise EdgerunError(f"remote backend names look like remote:HOST:PORT, got {name!r}")
    if not (os.environ.get("EDGERUN_TOKEN") or os.environ.get("EDGERUN_CLIENT_KEY")):
        raise EdgerunError(f"backend {name!r} needs the device's token in EDGERUN_TOKEN, or CURVE key files "
                           "named by EDGERUN_SERVER_KEY and EDGERUN_CLIENT_KEY")
    return RemoteBackend(f"tcp://{address}", name=name)
