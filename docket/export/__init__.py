"""Exports of a run's record to other tools (docs/export.md): `docket export otel`."""
