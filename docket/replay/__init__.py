"""`docket replay RUN -- CMD`: an agent's recorded conversation served back, offline.

match.py     the recorded calls of a verified ledger, and the matcher (pure)
recording.py reading a run's folder: verify its receipt, refuse what cannot be replayed
upstream.py  the replay upstream: a local server answering from the recording
faults.py    what an injected fault does to a replayed answer (docket chaos --replay decides)
hold.py      the stand-in agent the pytest plugin runs under docket replay
command.py   the verb: the upstream, then a supervised run pointed at it
"""
