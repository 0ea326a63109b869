"""The ledger: JSON lines, hash-chained, each event fsynced before it counts.

chain.py is pure (bytes in, decisions out); writer.py moves bytes under trio;
reader.py scans files and classifies their tails.
"""
