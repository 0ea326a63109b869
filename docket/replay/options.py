"""The choices `docket replay` offers, in a module light enough for the command line's
parser (which every `docket` invocation builds) to import."""

POLICIES = ("exact", "order", "model+messages")  # --match (match.Matcher)
ON_MISS = ("fail", "error", "forward")  # --on-miss (upstream.ReplayUpstream)
PACES = ("fast", "recorded")  # --pace
