"""Backends, one module (or package) each. `reference` is the numpy executable spec."""
