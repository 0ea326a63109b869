"""Docket: a flight recorder and chaos harness for AI agent runs.

`docket` is the recorder. It never imports `chaos`, the harness that drives it
from outside.
"""

__version__ = "0.1.0"
