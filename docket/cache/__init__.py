"""The opt-in response cache (issue 17, docs/cache.md): a pure bounded store
(store.py), pure decisions on what may be stored and served (decide.py), its
[cache] policy table (config.py), and the boundary's use of them (boundary.py)."""
