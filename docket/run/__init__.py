"""One supervised run, `docket run -- CMD`: the supervisor and its parts.

supervisor.py orders a run (boundary, child, reap, receipt); values.py holds what
goes in and comes out; child.py is the child at the OS level; control.py and
orphans.py spawn, signal, stop and sweep it; hardening.py is what the supervisor
asks of the kernel; launch.py is the child's first process (`python -m
docket.run.launch`); hooks.py is what a harness may hand a run.
"""
