"""The h11 that the HTTP layer runs on.

h11-mypyc, when it is installed, is h11's state machine compiled with mypyc:
the same API and behaviour, about twice as fast, which on the boundary's hot
path came to about 14% of its CPU per call when both sides of a call were h11
connections; the upstream side now parses with llhttp (docs/adr/0008), so h11
serves the agent's side. Otherwise h11 itself. Everything in docket/http takes h11 from here, so
one process never mixes the two (their event classes are distinct).
"""

from __future__ import annotations

try:
    import h11_mypyc as h11
except ImportError:
    import h11

__all__ = ["h11"]
