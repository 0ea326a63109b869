"""The reference agent, `docket agent`: a small model client that drives the boundary.

command.py is `docket agent` itself (the client, the stop signals); config.py reads
the environment and flags; calls.py says what an answer means; modes.py sends,
reads and sleeps; report.py is its summary line; backoff.py its retry policy (what is retried, the
waits, the deadline); budget.py its retry budget.
"""
