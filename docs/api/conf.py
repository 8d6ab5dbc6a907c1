"""Sphinx configuration of the API reference (docs/api/): autodoc reads the docstrings of the public API.

Built by `make docs` (and so by `make test`) with warnings as errors, so a renamed function, a broken
cross-reference or a docstring docutils cannot read fails the build.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

project = "edgerun"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# The docstrings are prose written for `help()`, not reStructuredText roles; what autodoc must check is that
# every documented name imports and renders.
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
html_theme = "alabaster"
html_static_path: list[str] = []
exclude_patterns = ["_build"]
nitpicky = False
