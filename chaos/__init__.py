"""The chaos harness: stub providers, faults, game days. Drives the recorder from outside."""
