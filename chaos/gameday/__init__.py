"""Game days: phase files, the runner, assertions over the evidence, the report."""
