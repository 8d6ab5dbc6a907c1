"""docs/ops.md is generated from the registry; this keeps the two in step."""

from pathlib import Path

from edgerun.cli.ops import ops_markdown


def test_ops_doc_matches_registry() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
    assert doc.read_text() == ops_markdown(), "regenerate with: edgerun ops --markdown > docs/ops.md"
