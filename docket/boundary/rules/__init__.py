"""The admission rules, one file each (fact, pure check, learner); their order is
admission.RULES, the one place a rule is registered (docs/adr/0011-boundary-rooms.md)."""
