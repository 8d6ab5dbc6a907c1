"""The import layers drawn in docs/design.md, checked against every import in the package.

The layer list is read from the ```layers block of docs/design.md (top layer first), so the drawing and
the check cannot drift apart. Every module belongs to the component with the longest matching name; a
module may import its own component and the components of lower layers, never a component of its own
layer or above. Imports are read with ast, module level and inside functions alike (a lazy import is
still a dependency), `if TYPE_CHECKING:` ones included.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgerun"
DESIGN = ROOT / "docs" / "design.md"


def read_layers(text: str) -> list[list[str]]:
    """Layers from the ```layers block, bottom first; each a list of components (dotted names under edgerun)."""
    match = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    assert match, "docs/design.md has no ```layers block"
    rows = [line.split("#")[0].split() for line in match.group(1).splitlines()]
    return [row for row in rows if row][::-1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(name: str) -> bool:
    return (ROOT.joinpath(*name.split(".")) / "__init__.py").exists()


def imported_modules(path: Path, own: str | None = None) -> Iterator[tuple[str, int]]:
    """(absolute module name, line) of every import in the file of module `own` (default: from its path)."""
    own = own or module_name(path)
    package = own if is_package(own) else own.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from edgerun import zoo` imports the module edgerun.zoo; `from edgerun import __version__`
                # reads the root module.
                sub = f"{base}.{alias.name}"
                yield (sub if is_package(sub) or ROOT.joinpath(*sub.split(".")).with_suffix(".py").exists()
                       else base), node.lineno


def component_of(module: str, components: list[str]) -> str | None:
    if module == "edgerun":
        return "edgerun" if "edgerun" in components else None  # the root module is a component of its own
    best = None
    for comp in components:
        full = f"edgerun.{comp}"
        if (module == full or module.startswith(full + ".")) and (best is None or len(comp) > len(best)):
            best = comp
    return best


def component_imports(layers: list[list[str]]) -> tuple[dict[tuple[str, str], list[str]], list[str]]:
    """{(importer component, imported component): [where]} over the whole package, and unplaced modules."""
    components = [c for layer in layers for c in layer]
    edges: dict[tuple[str, str], list[str]] = {}
    unplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        own = component_of(module, components)
        if own is None:
            unplaced.append(module)
            continue
        for target, line in imported_modules(path):
            if target != "edgerun" and not target.startswith("edgerun."):
                continue
            other = component_of(target, components)
            if other is None:
                unplaced.append(target)
            elif other != own:
                edges.setdefault((own, other), []).append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return edges, sorted(set(unplaced))


LAYERS = read_layers(DESIGN.read_text())
EDGES, UNPLACED = component_imports(LAYERS)


def test_every_module_is_in_a_drawn_layer() -> None:
    assert not UNPLACED, f"modules in no layer of docs/design.md (add their package to the ```layers block): {UNPLACED}"


def test_imports_only_run_down_the_layers() -> None:
    level = {c: k for k, layer in enumerate(LAYERS) for c in layer}
    upward = [f"{a} (layer {level[a]}) -> {b} (layer {level[b]}): {where[0]}"
              for (a, b), where in EDGES.items() if level[b] >= level[a]]
    assert not upward, "imports that do not run down the layers in docs/design.md:\n" + "\n".join(upward)


def test_no_import_cycle_between_components() -> None:
    graph: dict[str, set[str]] = {}
    for a, b in EDGES:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            assert cycle is None, "import cycle between components: " + " -> ".join(cycle)


@pytest.mark.parametrize("text, expected", [
    ("```layers\ncli\nruntime  # note\n\nir oracle\n```\n", [["ir", "oracle"], ["runtime"], ["cli"]]),
])
def test_layer_block_is_read_bottom_first(text: str, expected: list[list[str]]) -> None:
    assert read_layers(text) == expected


def test_an_upward_import_is_seen(tmp_path: Path) -> None:
    # The checker itself: a lazy import inside a function, and a relative one, are both found.
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from edgerun.runtime import load\n    from ..search import auto\n")
    found = {t for t, _ in imported_modules(probe, "edgerun.ir.probe")}
    assert {"edgerun.runtime", "edgerun.search.auto"} <= found
    assert component_of("edgerun.search.auto", ["search", "ir"]) == "search"
    assert component_of("edgerun.remote.server", ["remote", "remote.server"]) == "remote.server"
