"""Find backends by name. A backend is one module exposing `create_backend() -> Backend`.

Names resolve, in order, to a factory registered at run time (`register_backend`: tests, plug-ins), then to
the module `edgerun.backends.<name>` (or the path in `_MODULES`). A module whose third-party dependency is
missing raises BackendUnavailableError naming the pip extra that installs it.

Which backends `backends="auto"` places on is declared here too, so that the search never lists them: a
shipped backend by its entry in SHIPPED, a plug-in by `register_backend(name, factory, joins_auto=True)` in
its own module. Nothing else names a backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from edgerun.backends.base import Backend
from edgerun.errors import BackendUnavailableError

BackendFactory = Callable[[], Backend]

# The module of a backend that does not live at edgerun.backends.<name> (an out-of-tree plug-in).
_MODULES: dict[str, str] = {}
# The pip extra per backend, where it differs from "the backend's name" or the module cannot be imported to ask.
_EXTRAS = {"onnxruntime": "onnxruntime", "remote": "remote", "webgpu": "webgpu"}
# The backends the project ships -> whether `backends="auto"` considers it wherever it is installed (a
# backend that needs a device address, a GPU adapter or an emulator is named explicitly instead). Listed in
# error messages so a typo is easy to spot.
SHIPPED: dict[str, bool] = {"onnxruntime": True, "mnn": True, "reference": True,
                            "webgpu": False, "npu": False, "remote": False}
KNOWN_BACKENDS = tuple(SHIPPED)

_factories: dict[str, BackendFactory] = {}
_joins_auto: dict[str, bool] = {}
_instances: dict[str, Backend] = {}


def register_backend(name: str, factory: BackendFactory, *, replace: bool = False, joins_auto: bool = False) -> None:
    """Make `get_backend(name)` call `factory` (once; the instance is shared); with `joins_auto` the backend
    is also a candidate of every `backends="auto"` load."""
    if name in _factories and not replace:
        raise ValueError(f"backend {name!r} is already registered")
    _factories[name] = factory
    _joins_auto[name] = joins_auto
    _instances.pop(name, None)


def unregister_backend(name: str) -> None:
    _factories.pop(name, None)
    _joins_auto.pop(name, None)
    _instances.pop(name, None)


def auto_candidates() -> list[str]:
    """The names `backends="auto"` considers, the reference last (the search breaks ties toward the first):
    the shipped ones that join it, then the registered ones that declared they do."""
    names = [n for n, joins in {**SHIPPED, **_joins_auto}.items() if joins and n != "reference"]
    return [*names, "reference"]


def get_backend(name: str) -> Backend:
    """The shared instance of backend `name`; BackendUnavailableError when it is not installed or unknown."""
    inst = _instances.get(name)
    if inst is None:
        inst = _create(name)
        _instances[name] = inst
    return inst


def _create(name: str) -> Backend:
    factory = _factories.get(name)
    if factory is not None:
        return factory()
    if name.startswith("remote:"):
        # One backend per device address; the module needs pyzmq (the `remote` extra).
        try:
            from edgerun.backends.remote import create_remote_backend
        except ModuleNotFoundError as exc:
            raise BackendUnavailableError(f"backend {name!r} needs the package {exc.name!r}: "
                                          "pip install edgerun[remote]") from None
        return create_remote_backend(name)
    module_name = _MODULES.get(name, f"edgerun.backends.{name}")
    if not name.isidentifier():
        raise BackendUnavailableError(f"no backend named {name!r}; known backends: {', '.join(KNOWN_BACKENDS)}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise BackendUnavailableError(
                f"no backend named {name!r}; known backends: {', '.join(_known())}") from None
        extra = _EXTRAS.get(name, name)
        raise BackendUnavailableError(
            f"backend {name!r} needs the package {exc.name!r}, which is not installed: "
            f"pip install edgerun[{extra}]") from None
    create = getattr(module, "create_backend", None)
    if create is None:
        raise BackendUnavailableError(f"module {module_name} has no create_backend()")
    backend = create()
    if not isinstance(backend, Backend):
        raise BackendUnavailableError(f"{module_name}.create_backend() returned {type(backend).__name__}, "
                                      "not a Backend")
    return backend


def _known() -> list[str]:
    return sorted({*KNOWN_BACKENDS, *_factories})


def available_backends() -> list[str]:
    """Names of the backends that load here (imports each; cheap after the first call)."""
    ok = []
    for name in _known():
        try:
            get_backend(name)
        except BackendUnavailableError:
            continue
        ok.append(name)
    return ok
