"""The seven applications of the seed, each with a float64 numpy reference, and the harness that runs one."""

from __future__ import annotations

from edgerun.accel.apps.common import APP_NAMES, App, get_app, metrics, run_app

__all__ = ["APP_NAMES", "App", "get_app", "metrics", "run_app"]
