"""The receipt a run ends with and its check: `docket verify`.

tally.py counts a run's calls and costs from its events; receipt.py writes the
receipt (spec/docket-receipt-1.md); verify.py checks a receipt against its ledger.
"""
