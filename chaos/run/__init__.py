"""One chaos run: a scenario under a seeded fault schedule, and what it leaves.

engine.py is `run_chaos` (here, or in a worker process when the supervisor may be
killed); here.py runs it in this process; worker.py in a process of its own;
launcher.py starts the scenario's agents under one supervised command;
upstreams.py the stubs and the fault proxy; evidence.py records each fault;
collect.py reads the run's folder back.
"""
