"""Bring-up and debugging tools: carve, check, migrate, inspect, profile, reduce (docs/devtools.md).

    loaded = load_graph("model.erp")
    bundle = carve(loaded, [read_inputs("real.npz", loaded.graph)])        # carved tests, TAPML §III-C
    report = check_bundle(bundle, backend_from_spec("faulty:tanh_nan"))   # operator-wise validation
    migration = migrate(loaded, inputs, bundle, source, target)          # Algorithm 1
"""

from edgerun.devtools.backends import backend_from_spec
from edgerun.devtools.bundle import BundlePolicy, CarvedCase, TestBundle
from edgerun.devtools.carve import carve, carve_to
from edgerun.devtools.check import CheckReport, check_bundle
from edgerun.devtools.compare import ErrorStats, Tolerance, Tolerances, compare_arrays
from edgerun.devtools.inspect import InspectReport, inspect_program
from edgerun.devtools.migrate import MigrationReport, migrate
from edgerun.devtools.profile import Profile, profile_program
from edgerun.devtools.programs import load_graph, read_inputs
from edgerun.devtools.random_tests import random_unit_tests
from edgerun.devtools.reduce import ReduceResult, reduce_program

__all__ = [
    "BundlePolicy", "CarvedCase", "CheckReport", "ErrorStats", "InspectReport", "MigrationReport", "Profile",
    "ReduceResult", "TestBundle", "Tolerance", "Tolerances", "backend_from_spec", "carve", "carve_to",
    "check_bundle", "compare_arrays", "inspect_program", "load_graph", "migrate", "profile_program",
    "random_unit_tests", "read_inputs", "reduce_program",
]
