"""What a team adopting the package reads before it installs it: pyproject.toml's license,
classifiers, URLs and dependency bounds, held against the supported matrix that noxfile.py
runs and docs/versions.md and the README state; and a repository with no stray data files."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def nox_matrix() -> dict[str, list[str]]:
    """PYTHONS, DJANGOS and CELERYS as noxfile.py defines them (read, not imported: nox is
    only in the ci group)."""
    found: dict[str, list[str]] = {}
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("PYTHONS", "DJANGOS", "CELERYS"):
                found[target.id] = ast.literal_eval(node.value)
    assert set(found) == {"PYTHONS", "DJANGOS", "CELERYS"}, found
    return found


def requirement(name: str) -> Requirement:
    found = [Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, PROJECT["dependencies"]
    return found[0]


def series_after(series: str) -> str:
    major, minor = series.split(".")
    return f"{major}.{int(minor) + 1}"


def test_parsers_read_the_files() -> None:
    """The helpers below read what they claim to (guards the other tests from passing on an
    empty read)."""
    matrix = nox_matrix()
    assert "3.10" in matrix["PYTHONS"] and "5.2" in matrix["DJANGOS"], matrix
    assert requirement("django").name == "django"
    assert series_after("5.7") == "5.8" and series_after("6.9") == "6.10"


def test_license_file_matches_pyproject() -> None:
    """The package says MIT; the LICENSE file beside it is the MIT text, shipped in the wheel
    (hatchling copies LICENSE* into the wheel's .dist-info/licenses)."""
    assert PROJECT["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License"), text[:80]
    assert "the dedup_jobs authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


@pytest.mark.parametrize("package, key", [("django", "DJANGOS"), ("celery", "CELERYS")])
def test_dependency_bounds_match_the_matrix(package: str, key: str) -> None:
    """The dependency admits every release of each supported series, and neither the series
    before the oldest nor the one after the newest (an untested major bump must not install)."""
    series = nox_matrix()[key]
    spec = requirement(package).specifier
    for one in series:
        for patch in ("0", "99"):
            assert Version(f"{one}.{patch}") in spec, f"{package} {one}.{patch} vs {spec}"
    assert Version(f"{series_after(series[-1])}.0") not in spec, f"{package} {spec}"
    oldest = Version(series[0])
    before = f"{oldest.major}.{oldest.minor - 1}.99" if oldest.minor else f"{oldest.major - 1}.99"
    assert Version(before) not in spec, f"{package} {spec}"


def test_python_bound_matches_the_matrix() -> None:
    oldest = nox_matrix()["PYTHONS"][0]
    assert PROJECT["requires-python"] == f">={oldest}"


def test_classifiers_name_every_supported_version() -> None:
    """One classifier per supported Python and Django version, and Celery's framework."""
    matrix = nox_matrix()
    classifiers = set(PROJECT["classifiers"])
    pythons = {c.rsplit(" :: ", 1)[1] for c in classifiers
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    djangos = {c.rsplit(" :: ", 1)[1] for c in classifiers
               if re.fullmatch(r"Framework :: Django :: \d+\.\d+", c)}
    assert pythons == set(matrix["PYTHONS"]), sorted(classifiers)
    assert djangos == set(matrix["DJANGOS"]), sorted(classifiers)
    assert {"Framework :: Celery", "Framework :: Django",
            "Programming Language :: Python :: 3 :: Only"} <= classifiers, sorted(classifiers)


def test_docs_state_the_same_matrix() -> None:
    """docs/versions.md's table and the README's sentence list what noxfile.py runs."""
    matrix = nox_matrix()
    versions = (ROOT / "docs" / "versions.md").read_text()
    rows = dict(re.findall(r"^\| (Python|Django|Celery) \| (.+?) \|$", versions, re.M))
    assert re.findall(r"\d+\.\d+", rows["Python"]) == matrix["PYTHONS"], rows
    assert re.findall(r"\d+\.\d+", rows["Django"]) == matrix["DJANGOS"], rows
    assert re.findall(r"\d+\.\d+", rows["Celery"]) == matrix["CELERYS"], rows
    readme = " ".join((ROOT / "README.md").read_text().split())
    pythons, djangos, celerys = matrix["PYTHONS"], matrix["DJANGOS"], matrix["CELERYS"]
    assert f"Python {pythons[0]}\u2013{pythons[-1]};" in readme  # an en dash
    assert f"Django {', '.join(djangos[:-1])} and {djangos[-1]}" in readme
    assert f"Celery {celerys[0]}\u2013{celerys[-1]}" in readme


def test_project_urls_are_absolute() -> None:
    """PyPI refuses an upload whose Project-URL is not an http(s) URL: a relative path to the
    docs would break the release, not just the link."""
    for label, url in PROJECT.get("urls", {}).items():
        assert re.match(r"https?://[^/\s]+", url), (label, url)


def test_repository_holds_no_dump_or_data_file() -> None:
    """A Redis dump (or any server's data file) written by a test run is never committed;
    .gitignore keeps it out."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing to list")
    listed = subprocess.run([git, "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    data = [p for p in listed if re.search(r"\.(rdb|aof|sqlite3|db)$", p)]
    assert not data, data
    ignored = subprocess.run([git, "check-ignore", "--no-index", "dump.rdb", "sub/dump.rdb"],
                             cwd=ROOT, capture_output=True, text=True, check=False).stdout.split()
    assert ignored == ["dump.rdb", "sub/dump.rdb"], ignored
