"""Errors a user sees as one line on stderr, each with its exit code.

Exit codes are part of the interface (README, `docket --help`):
0 ok; 1 a check failed; 2 usage or input error; 42 a run stopped by a cap.
"""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_CAP_KILL = 42  # a cap or a ledger ceiling stopped the run
# fail_fast_evidence: a ledger write failed, so the run stopped; or the receipt could
# not be written in the run's folder and went to its fallbacks
EXIT_EVIDENCE_LOST = 43


def one_line(text: str, limit: int = 2000) -> str:
    """`text` as one printable line: control characters (CR, LF, NUL, ESC, ...) shown
    as escapes, and cut at `limit` characters.

    Error messages echo what the user gave (a fault text, a file name, a value), and
    input may hold anything: a message that spans lines, or carries a terminal escape,
    would be mistaken for several messages, or rewrite the user's screen.
    """
    out = "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[:limit] + f"... ({len(out) - limit} more)"


class DocketError(Exception):
    """A problem the user can act on; the CLI prints `docket: <message>` and exits."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(DocketError):
    """A missing, empty, unreadable or malformed input file or argument (exit 2)."""

    exit_code = EXIT_USAGE


class CheckFailed(DocketError):
    """A verification or classification that ran and found a problem (exit 1)."""

    exit_code = EXIT_CHECK_FAILED
