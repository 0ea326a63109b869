"""The opt-in response cache (docs/cache.md): a pure bounded store
(store.py), pure decisions on what may be stored and served and what the key covers
(decide.py), its [cache] policy table (config.py), a store shared between runs
(shared.py: the file, its lock, identity and seal; entries.py: every check an entry
passes before it is served, pure), and the check of a hit against the ledger of the
run that stored its answer (origin.py, pure). The boundary's use of them is
docket/boundary/cache.py."""
