"""The boundary's guards: pure decision objects (facts and a clock reading in, a decision out).

None of them does I/O or reads a clock itself; the trio layer feeds them and
turns their decisions into ledger events and HTTP answers.
"""
