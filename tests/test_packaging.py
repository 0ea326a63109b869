"""pyproject.toml lists packages by hand (the data folders are mapped into chaos.data.*),
so a package added under docket/ or chaos/ and forgotten there would be missing from the
wheel. This holds the list to the tree. `nox -s gameday` installs the wheel (not editable),
so the data folders are exercised from a real install there."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_in_the_tree_is_listed():
    listed = set(_setuptools()["packages"])
    in_tree = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("docket", "chaos")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert in_tree - listed == set(), "add these to [tool.setuptools] packages"
    mapped = set(_setuptools()["package-dir"])
    assert listed - in_tree - mapped == set(), "listed packages that do not exist"


def test_data_folders_are_mapped_and_present():
    from chaos.data.locate import FOLDERS

    mapping = _setuptools()["package-dir"]
    for name in FOLDERS:
        assert mapping[f"chaos.data.{name}"] == name
        assert (ROOT / name).is_dir()
        assert _setuptools()["package-data"][f"chaos.data.{name}"], name


def test_the_locator_finds_the_checkouts_folders():
    from chaos.data.locate import folder

    assert Path(str(folder("docs"))) == ROOT / "docs"
    assert (folder("docs") / "resilience.md").is_file()
