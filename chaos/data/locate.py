"""Where the harness's data folders are, in a checkout and in an installed wheel.

gamedays/, scenarios/ and reports/ sit at the top of the repository, where a
person edits them; pyproject.toml maps each into the wheel as a package under
chaos.data, so `docket game-day` works from a non-editable install too.
docs/resilience.md (the FMEA table the report links to) travels the same way.
"""

from __future__ import annotations

from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]  # the repository, when run from one

FOLDERS = ("gamedays", "scenarios", "reports", "docs")


def folder(name: str) -> Traversable:
    """The packaged folder `name` (one of FOLDERS)."""
    if name not in FOLDERS:
        raise ValueError(f"no data folder {name!r}; one of {', '.join(FOLDERS)}")
    # In a checkout the top-level folder is the truth (and the only place an
    # editable install finds it, since chaos/ is imported from the tree itself).
    here = _CHECKOUT / name
    if (_CHECKOUT / "pyproject.toml").is_file() and here.is_dir():
        return here
    return files(f"chaos.data.{name}")


__all__ = ["FOLDERS", "as_file", "folder"]
