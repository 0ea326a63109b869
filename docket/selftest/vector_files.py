"""Where the committed test vectors are (spec/vectors), in a checkout and in a wheel.

spec/vectors sits at the top of the repository, where spec/vectors/make_vectors.py
writes it; pyproject.toml maps it into the wheel as the data package
docket.selftest.vectors (as it maps gamedays/ into chaos.data.*), so `docket
selftest` checks them from any install without docket importing the harness.
In a wheel they are plain files in the folder `vectors` beside this module.
"""

from __future__ import annotations

import json
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parents[1]


def vectors_folder() -> Path:
    """The folder holding manifest.json: the checkout's spec/vectors, else the installed copy.
    FileNotFoundError when neither is there (a broken install), which fails the check."""
    for folder in (_CHECKOUT / "spec" / "vectors", _HERE / "vectors"):
        if (folder / "manifest.json").is_file():
            return folder
    raise FileNotFoundError(
        f"no manifest.json in {_CHECKOUT / 'spec' / 'vectors'} or {_HERE / 'vectors'}"
    )


def manifest(folder: Path) -> list[dict]:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["vectors"]
