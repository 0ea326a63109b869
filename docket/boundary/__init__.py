"""The boundary: the local HTTP proxy an agent's SDK talks to, and what it must understand
of provider traffic (providers/). Imports nothing at package level, so a verb that
needs one adapter does not load the server."""
