"""The numpy reference backend: the executable spec every other backend is checked against."""

from edgerun.backends.reference.kernels import KERNELS, Kernel

__all__ = ["KERNELS", "Kernel"]
