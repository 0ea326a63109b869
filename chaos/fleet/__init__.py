"""The fleet scenario: many `docket run` boundaries under one budget in PostgreSQL,
with faults on the database (`python -m chaos.fleet scenarios/fleet-partition.yaml`)."""
