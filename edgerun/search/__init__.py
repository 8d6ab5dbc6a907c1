"""Load-time search: calibrate backends once per device, model costs, place nodes, tune, cache.

    model = load(path, backends="auto")           # edgerun.load: search, then the runtime
    plan = plan_auto(graph)                       # the placement alone
    profiles = calibrate(["onnxruntime", "reference"])   # the `edgerun calibrate` command
"""

from edgerun.search.auto import AutoPlan, auto_backends, load, plan_auto, program_key
from edgerun.search.calibrate import BackendProfile, calibrate, calibration_path, load_profiles
from edgerun.search.cost_model import CostTable, cost_table, node_seconds
from edgerun.search.fingerprint import CACHE_ENV, cache_dir, device_description, device_fingerprint
from edgerun.search.placement_search import SearchResult, search_placement
from edgerun.search.tune import cached_placement, tune_placement, tuned_path

__all__ = [
    "CACHE_ENV", "AutoPlan", "BackendProfile", "CostTable", "SearchResult", "auto_backends", "cache_dir",
    "cached_placement", "calibrate", "calibration_path", "cost_table", "device_description",
    "device_fingerprint", "load", "load_profiles", "node_seconds", "plan_auto", "program_key",
    "search_placement", "tune_placement", "tuned_path"
]
