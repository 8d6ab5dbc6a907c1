"""The reference numerics that every backend is checked against (kernels registered by the reference backend)."""
