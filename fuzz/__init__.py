"""Coverage-guided fuzzers (atheris) of edgerun's parsers of untrusted bytes; see docs/security.md."""
