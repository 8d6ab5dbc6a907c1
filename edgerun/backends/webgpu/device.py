"""The WebGPU device: one adapter and device per process, its limits, and errors turned into EdgerunErrors.

wgpu-py runs WebGPU through wgpu-native; on a machine without a GPU, Mesa's lavapipe (a CPU Vulkan driver)
gives a correct, slow adapter. No adapter at all is a BackendUnavailableError naming what to install.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import wgpu  # the optional dependency: the registry turns its absence into BackendUnavailableError

from edgerun.errors import BackendUnavailableError, EdgerunError

INSTALL_HINT = ("pip install wgpu (or edgerun[webgpu]); without a GPU, the CPU Vulkan driver: "
                "apt-get install mesa-vulkan-drivers libvulkan1")
T = TypeVar("T")


class DeviceLostError(EdgerunError):
    """The WebGPU device was lost or refused work; the program must be loaded again."""


@dataclass(frozen=True)
class Limits:
    max_binding_bytes: int  # maxStorageBufferBindingSize
    max_buffer_bytes: int
    max_workgroups: int  # per dimension
    max_storage_buffers: int  # per shader stage
    offset_alignment: int  # minStorageBufferOffsetAlignment
    max_workgroup_size: int  # threads of a 1-D workgroup: maxComputeWorkgroupSizeX, maxComputeInvocationsPerWorkgroup

    @classmethod
    def of(cls, limits: Any) -> Limits:
        return cls(int(limits["max-storage-buffer-binding-size"]), int(limits["max-buffer-size"]),
                   int(limits["max-compute-workgroups-per-dimension"]),
                   int(limits["max-storage-buffers-per-shader-stage"]),
                   int(limits["min-storage-buffer-offset-alignment"]),
                   min(int(limits["max-compute-workgroup-size-x"]),
                       int(limits["max-compute-invocations-per-workgroup"])))


class GpuDevice:
    """A wgpu device with what the backend needs to know about it."""

    def __init__(self, adapter: Any, without: Collection[str] = ()) -> None:
        """`without`: optional features not to request, so a test sees what an adapter lacking them gets."""
        self.adapter = adapter
        limits = adapter.limits
        wanted = [f for f in ("shader-f16", "timestamp-query") if f in adapter.features and f not in without]
        self.device = adapter.request_device_sync(required_features=wanted, required_limits={
            "max-storage-buffers-per-shader-stage": limits["max-storage-buffers-per-shader-stage"],
            "max-storage-buffer-binding-size": limits["max-storage-buffer-binding-size"],
            "max-buffer-size": limits["max-buffer-size"]})
        self.limits = Limits.of(self.device.limits)
        self.features = set(self.device.features)
        self.lost = False
        info = adapter.info
        self.description = f"{info.get('device', '?')} ({info.get('backend_type', '?')}, {info.get('adapter_type', '?')})"
        self._pipelines: dict[str, Any] = {}

    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.features

    def pipeline(self, source: str) -> Any:
        """The compute pipeline of a WGSL source, compiled once per device."""
        pipe = self._pipelines.get(source)
        if pipe is None:
            with self.errors("compiling a shader"):
                module = self.device.create_shader_module(code=source)
                pipe = self.device.create_compute_pipeline(layout="auto",
                                                           compute={"module": module, "entry_point": "main"})
            self._pipelines[source] = pipe
        return pipe

    def destroy(self) -> None:
        """Lose the device on purpose (tests of device loss); every later call raises DeviceLostError."""
        self.lost = True
        self.device.destroy()

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Turn wgpu's errors into edgerun's: a lost device or a refused command never hangs or leaks."""
        if self.lost:
            raise DeviceLostError(f"the WebGPU device ({self.description}) was lost; load the program again")
        try:
            yield
        except EdgerunError:
            raise
        except Exception as exc:  # wgpu raises GPUValidationError, GPUOutOfMemoryError, RuntimeError, ...
            if "lost" in str(exc).lower() or "destroy" in str(exc).lower():
                self.lost = True
                raise DeviceLostError(f"the WebGPU device ({self.description}) was lost while {doing}: "
                                      f"{exc}") from None
            raise EdgerunError(f"WebGPU error while {doing} on {self.description}: "
                               f"{type(exc).__name__}: {exc}") from None

    def call(self, doing: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self.errors(doing):
            return fn(*args, **kwargs)


_device: GpuDevice | None = None


def get_device() -> GpuDevice:
    """The process's WebGPU device (created on first use); BackendUnavailableError when there is no adapter."""
    global _device
    if _device is None or _device.lost:
        _device = GpuDevice(_request_adapter())
    return _device


def _request_adapter() -> Any:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences Mesa's warning on headless machines
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendUnavailableError(f"backend 'webgpu' found no WebGPU adapter: {INSTALL_HINT} "
                                      f"(wgpu said: {first})") from None
    if adapter is None:
        raise BackendUnavailableError(f"backend 'webgpu' found no WebGPU adapter: {INSTALL_HINT}")
    return adapter
