"""The ledger: JSON lines, hash-chained, each event fsynced before it counts.

chain.py is pure (bytes in, decisions out) and strict_json.py is how it reads
JSON; book.py is the writer's sans-IO state; writer.py moves bytes under trio;
reader.py splits files into lines; doctor.py classifies a ledger and its tail.
"""
