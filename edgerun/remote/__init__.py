"""The universal remote runtime: drive any backend on another device from host Python (TAPML, section III-E)."""

from edgerun.remote.client import RemoteDevice, RemoteFunction, RemoteTensor, connect

__all__ = ["RemoteDevice", "RemoteFunction", "RemoteTensor", "connect"]
