"""A fleet budget: many boundaries, on many machines, under one set of caps.

escrow.py is the pure core (facts and a clock reading in, decisions out);
pool.py is the shared budget's arithmetic, the model the SQL in store.py keeps;
store.py is PostgreSQL; lease.py runs one boundary's escrow against the store;
command.py is `docket fleet`. The arithmetic and the failure table: docs/fleet.md.
"""
