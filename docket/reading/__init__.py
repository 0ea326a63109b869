"""Reading a run after (or while) it happens: `docket explain`, `docket diff`, `docket show`.

Every command here is a fold over a ledger's events, read through the strict
chain verifier (docket.ledger.chain), and over receipts checked by `docket verify`:
no state of its own, nothing written.
"""
