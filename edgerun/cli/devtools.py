"""`edgerun carve | check | migrate | inspect | profile | reduce`: the bring-up and debugging tools."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from edgerun.devtools.backends import backend_from_spec
from edgerun.devtools.bundle import BundlePolicy, TestBundle
from edgerun.devtools.compare import Tolerances
from edgerun.devtools.programs import (
    InputSet,
    LoadedGraph,
    call_sequence,
    load_graph,
    random_inputs,
    read_arrays,
)
from edgerun.errors import EdgerunError


def _inputs(args: argparse.Namespace, loaded: LoadedGraph, required: bool = True) -> list[InputSet]:
    """The input sets of --inputs, in order; for a method with state, a sequence of calls whose state flows
    from one to the next (devtools/programs.py)."""
    paths = args.inputs or []
    if not paths:
        if required:
            raise EdgerunError("give realistic inputs with --inputs FILE.npz (arrays named like the program's "
                               f"inputs: {', '.join(loaded.user_inputs)})")
        return call_sequence(loaded, [random_inputs(loaded.graph, names=loaded.user_inputs)], ["random inputs"])
    return call_sequence(loaded, [read_arrays(p) for p in paths], paths)


def _load(args: argparse.Namespace, attr: str = "program") -> LoadedGraph:
    return load_graph(getattr(args, attr), getattr(args, "method", None))


def _write_json(path: str | None, data: object) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(data, fh, indent=1)


def _carve(args: argparse.Namespace) -> int:
    from edgerun.devtools.carve import carve_to

    loaded = _load(args)
    start = time.perf_counter()
    policy = BundlePolicy(args.max_cases_per_signature, int(args.max_mib * (1 << 20)))
    bundle = carve_to(loaded, _inputs(args, loaded), args.output, policy, progress=True)
    dropped = sum(bundle.dropped.values())
    print(f"carved {len(bundle)} cases of {len(bundle.ops())} op types from {len(loaded.graph.nodes)} nodes "
          f"({bundle.array_bytes / 1e6:.2f} MB of arrays, {dropped} cases dropped by the size policy) "
          f"into {args.output} in {time.perf_counter() - start:.2f} s")
    return 0


def _check(args: argparse.Namespace) -> int:
    from edgerun.devtools.check import check_bundle

    bundle = TestBundle.read(args.bundle)
    report = check_bundle(bundle, backend_from_spec(args.backend), ops=args.op, nodes=args.node,
                          case_ids=args.case, tolerances=Tolerances.parse(args.tol), progress=True,
                          label=args.backend)
    if not report.results:
        raise EdgerunError("no carved case matches the selection")
    print(report.table())
    if bundle.dropped:
        cut = ", ".join(f"{op} {n}" for op, n in sorted(bundle.dropped.items()))
        print(f"note: the size policy dropped calls at carve time (repeats of a signature or past the byte cap): "
              f"{cut}")
    for r in report.failures[:args.show]:
        w = r.worst
        detail = r.error or (f"max abs {w.max_abs:.3g}, max rel {w.max_rel:.3g}, NaN {w.nan}, Inf {w.inf}, "
                             f"ULP {w.max_ulp}, {w.violations}/{w.numel} out of tolerance" if w else "")
        print(f"FAIL {r.case.id} ({r.case.op}): {detail}")
    _write_json(args.json, report.to_json())
    return 0 if report.passed else 1


def _inspect_against(args: argparse.Namespace, loaded: LoadedGraph) -> int:
    from edgerun.devtools.quant_inspect import compare_quantized

    report = compare_quantized(loaded, _load(args, "against"), _inputs(args, loaded, required=False)[0],
                               min_snr_db=args.min_snr)
    print(report.table())
    print(report.summary())
    if args.json:
        report.save(args.json)
    return 0 if report.first_below is None else 1


def _report_dir(path: str) -> None:
    """Make the report folder, saying so when it replaces an earlier report there (the default is the same
    ./migration-report/ for every run, so a second migrate would otherwise overwrite the first silently)."""
    earlier = [n for n in ("migration.md", "migration.json", "tests.bundle") if os.path.exists(os.path.join(path, n))]
    if earlier:
        print(f"migrate: replacing the earlier report in {path}/ ({', '.join(earlier)}); "
              "--report-dir DIR keeps it", file=sys.stderr)
    os.makedirs(path, exist_ok=True)


def _migrate_against(args: argparse.Namespace, loaded: LoadedGraph) -> int:
    from edgerun.devtools.quant_migrate import migrate_against_float

    report = migrate_against_float(loaded, _load(args, "against"), _inputs(args, loaded, required=False),
                                   min_snr_db=args.min_snr)
    print(report.table())
    print(report.summary())
    _report_dir(args.report_dir)
    path = os.path.join(args.report_dir, "migration.json")
    report.save(path)
    print(f"report: {path}")
    return 0 if report.passed else 1


def _migrate(args: argparse.Namespace) -> int:
    from edgerun.devtools.carve import carve_to
    from edgerun.devtools.migrate import migrate

    loaded = _load(args)
    if args.against:
        return _migrate_against(args, loaded)
    if not args.target:
        raise EdgerunError("migrate needs --to BACKEND, or --against FLOAT_PROGRAM for a quantized program")
    inputs = _inputs(args, loaded)
    _report_dir(args.report_dir)
    bundle_path = args.bundle or os.path.join(args.report_dir, "tests.bundle")
    bundle = TestBundle.read(bundle_path) if args.bundle else carve_to(loaded, inputs, bundle_path, progress=True)
    report = migrate(loaded, inputs, bundle, backend_from_spec(args.source), backend_from_spec(args.target),
                     by=args.by, tolerances=Tolerances.parse(args.tol), only=args.only,
                     bundle_path=bundle_path, input_paths=args.inputs or [], progress=True)
    md, js = report.save(os.path.join(args.report_dir, "migration"))
    print(report.to_markdown())
    print(f"report: {md}, {js}")
    return 0 if report.passed else 1


def _inspect(args: argparse.Namespace) -> int:
    from edgerun.devtools.inspect import inspect_program

    loaded = _load(args)
    if args.against:
        return _inspect_against(args, loaded)
    if not args.backend:
        raise EdgerunError("inspect needs --backend (a backend against the reference) or --against FLOAT_PROGRAM")
    backend = backend_from_spec(args.backend)
    # A stateful method: every call of the sequence from the reference's state, up to the first that diverges.
    calls = _inputs(args, loaded) if loaded.state is not None else _inputs(args, loaded)[:1]
    for index, inputs in enumerate(calls):
        report = inspect_program(loaded, backend, inputs, ops=args.op, nodes=args.node,
                                 tolerances=Tolerances.parse(args.tol))
        if len(calls) > 1:
            print(f"call {index + 1} of {len(calls)}{' (' + args.inputs[index] + ')' if args.inputs else ''}:")
        print(report.table())
        print(report.summary())
        if not report.passed:
            break
    if args.json:
        report.save(args.json)
    return 0 if report.passed else 1


def _profile(args: argparse.Namespace) -> int:
    from edgerun.devtools.html_report import write_html
    from edgerun.devtools.inspect import inspect_program
    from edgerun.devtools.profile import profile_program
    from edgerun.devtools.trace import write_chrome_trace

    loaded = _load(args)
    inputs = _inputs(args, loaded, required=False)[0]
    backends = [backend_from_spec(b) for b in args.backend or ["reference"]]
    placement = None
    if args.op:
        placement = {n.name: backends[-1].name for n in loaded.graph.nodes if n.op in args.op}
    profile = profile_program(loaded, backends, inputs, placement=placement, repeat=args.repeat)
    print(profile.table(args.top))
    if args.trace:
        write_chrome_trace(profile, args.trace)
        print(f"trace: {args.trace} (open in ui.perfetto.dev or chrome://tracing)")
    if args.html:
        report = inspect_program(loaded, backends[-1], inputs) if args.inspect else None
        write_html(args.html, profile, report, title=f"edgerun profile of {args.program}")
        print(f"html: {args.html}")
    _write_json(args.json, profile.to_json())
    return 0


def _reduce(args: argparse.Namespace) -> int:
    from edgerun.devtools.reduce import reduce_program

    loaded = _load(args)
    result = reduce_program(loaded, backend_from_spec(args.backend), _inputs(args, loaded)[0],
                            predicate=args.predicate, tolerances=Tolerances.parse(args.tol))
    inputs_path = result.save(args.output, {"reduced_from": args.program, "backend": args.backend})
    ops = ", ".join(f"{n.name} ({n.op})" for n in result.graph.nodes[:10])
    print(f"reduced {result.nodes_before} nodes to {len(result.graph.nodes)} in {result.probes} probes: {ops}")
    print(f"  still fails: {result.reason}")
    print(f"  saved {args.output} and {inputs_path}; reproduce: edgerun inspect {args.output} "
          f"--backend {args.backend} --inputs {inputs_path}")
    return 0


METHOD_HELP = "the method of a multi-method program to work on (default: its default method)"
INPUTS_HELP = ("realistic inputs: an .npz of arrays named like the program's inputs (repeatable; for a method "
               "with state, a sequence of calls, each from the state the reference left after the one before)")


def _common(p: argparse.ArgumentParser, inputs: bool = True) -> None:
    if inputs:
        p.add_argument("--inputs", action="append", metavar="NPZ", help=INPUTS_HELP)
        p.add_argument("--method", help=METHOD_HELP)
    p.add_argument("--tol", action="append", metavar="DTYPE=ATOL,RTOL",
                   help="override a per-dtype tolerance, e.g. float32=1e-4,1e-3 (repeatable)")


def register(sub: argparse._SubParsersAction) -> None:
    backend_help = "a backend name, or faulty:<bug> for the fault-injection test backend"
    p = sub.add_parser("carve", help="record every op instance of a reference run as a test bundle")
    p.add_argument("program")
    p.add_argument("-o", "--output", required=True, help="bundle directory to write")
    p.add_argument("--max-cases-per-signature", type=int, default=BundlePolicy.max_cases_per_signature)
    p.add_argument("--max-mib", type=float, default=BundlePolicy.max_bytes / (1 << 20), help="array byte cap")
    p.add_argument("--inputs", action="append", metavar="NPZ", help=INPUTS_HELP)
    p.add_argument("--method", help=METHOD_HELP)
    p.set_defaults(func=_carve)

    p = sub.add_parser("check", help="replay carved cases on a backend; per-op error table")
    p.add_argument("bundle")
    p.add_argument("--backend", required=True, help=backend_help)
    p.add_argument("--op", action="append", help="only cases of this op type (repeatable)")
    p.add_argument("--node", action="append", help="only cases of this node (repeatable)")
    p.add_argument("--case", action="append", help="only this case id (repeatable)")
    p.add_argument("--show", type=int, default=10, help="failing cases to detail")
    p.add_argument("--json", help="write the report as JSON")
    _common(p, inputs=False)
    p.set_defaults(func=_check)

    p = sub.add_parser("migrate", help="move ops from one backend to another one at a time (TAPML Algorithm 1)")
    p.add_argument("program")
    p.add_argument("--from", dest="source", default="reference")
    p.add_argument("--to", dest="target", help=backend_help)
    p.add_argument("--against", metavar="FLOAT_PROGRAM",
                   help="migrate a quantized program's layers in one at a time from its float source, not a backend")
    p.add_argument("--min-snr", type=float, default=20.0, help="with --against: the outputs' SQNR each step keeps")
    p.add_argument("--by", choices=("op", "node"), default="op", help="unit moved per step")
    p.add_argument("--only", action="append", help="move only these units (op types or node names)")
    p.add_argument("--bundle", help="carved tests to use (default: carve now into the report directory)")
    p.add_argument("--report-dir", default="migration-report")
    _common(p)
    p.set_defaults(func=_migrate)

    p = sub.add_parser("inspect", help="compare every intermediate with the reference; first divergent op")
    p.add_argument("program")
    p.add_argument("--backend", help=backend_help)
    p.add_argument("--against", metavar="FLOAT_PROGRAM",
                   help="compare a quantized program with its float source value by value (SQNR), not a backend")
    p.add_argument("--min-snr", type=float, default=20.0, help="with --against: report the first value below this")
    p.add_argument("--op", action="append", help="place only these op types on the backend")
    p.add_argument("--node", action="append", help="place only these nodes on the backend")
    p.add_argument("--json", help="write the per-node comparison as JSON")
    _common(p)
    p.set_defaults(func=_inspect)

    p = sub.add_parser("profile", help="per-instruction timings; terminal table, Chrome trace, HTML report")
    p.add_argument("program")
    p.add_argument("--backend", action="append", default=None, help="backends in preference order (repeatable)")
    p.add_argument("--op", action="append", help="force these op types onto the last --backend")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--trace", help="write a Chrome/Perfetto trace JSON")
    p.add_argument("--html", help="write a self-contained HTML report")
    p.add_argument("--inspect", action="store_true", help="add the error-by-layer plot to the HTML report")
    p.add_argument("--json", help="write the profile as JSON")
    _common(p)
    p.set_defaults(func=_profile)

    p = sub.add_parser("reduce", help="shrink a failing program to a small subgraph that still fails")
    p.add_argument("program")
    p.add_argument("--backend", required=True, help=backend_help)
    p.add_argument("--predicate", choices=("fail", "crash", "error"), default="fail")
    p.add_argument("-o", "--output", required=True, help="reduced program to write")
    _common(p)
    p.set_defaults(func=_reduce)
