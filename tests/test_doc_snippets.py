"""A3: every settings snippet of the README and docs/ (a ```python block that sets CACHES,
DEDUP_JOBS or DATABASES) passes ``manage.py check`` with no warning, as a reader pastes it into
a new project (tests/settings_snippets.py), so that a page that promises "no issues" keeps it."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dedup_jobs.conf import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTINGS = ("CACHES", "DEDUP_JOBS", "DATABASES")
#: the docs' example hosts; the checks read settings and never connect, but nothing here may
#: even try: they become the loopback address
EXAMPLE_HOSTS = re.compile(r"\b(10\.0\.0\.\d+|db\.internal|sentinel-\d)\b")


def settings_statements(code: str) -> str:
    """The snippet's top-level assignments to UPPER_CASE names, and its imports, as written
    (a class or a call in the same block is not settings.py material)."""
    tree = ast.parse(code)
    kept = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            kept.append(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
                kept.append(node)
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and ast.unparse(node.value) == "pymysql.install_as_MySQLdb()"):
            kept.append(node)
    return "\n".join(ast.get_source_segment(code, node) or "" for node in kept)


def snippets() -> list[pytest.ParameterSet]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S):
            code = match.group(1)
            if not re.search(rf"^({'|'.join(SETTINGS)})\s*\+?=", code, re.M):
                continue
            line = text.count("\n", 0, match.start()) + 1
            origin = f"{page.relative_to(ROOT)}:{line}"
            found.append(pytest.param(origin, settings_statements(code), id=origin))
    return found


def defaults_listing(statements: str) -> dict[str, object] | None:
    """The DEDUP_JOBS of a snippet that lists the defaults (docs/settings.md: a lone
    DEDUP_JOBS of several keys, each at its default), checked against conf.DEFAULTS rather
    than pasted; None for any other snippet."""
    body = ast.parse(statements).body
    if not (len(body) == 1 and isinstance(body[0], ast.Assign)
            and ast.unparse(body[0].targets[0]) == "DEDUP_JOBS"):
        return None
    listed = ast.literal_eval(body[0].value)
    if not isinstance(listed, dict) or len(listed) < 4:
        return None
    marker = object()
    return listed if all(DEFAULTS.get(k, marker) == v for k, v in listed.items()) else None


def test_snippets_are_found() -> None:
    """The extraction finds the pages' snippets (guards the test below against passing on
    none): the README's, the quickstart's and installation's, the settings reference."""
    origins = {param.values[0].split(":")[0] for param in snippets()}  # type: ignore[union-attr]
    assert {"README.md", "docs/quickstart.md", "docs/installation.md",
            "docs/settings.md", "docs/stores.md"} <= origins, origins
    code = "import pymysql\npymysql.install_as_MySQLdb()\nX = 1\nclass A: pass\nf()\n"
    assert settings_statements(code) == "import pymysql\npymysql.install_as_MySQLdb()\nX = 1"


@pytest.mark.parametrize(("origin", "statements"), snippets())
def test_settings_snippet_passes_the_checks(origin: str, statements: str,
                                            tmp_path: Path) -> None:
    listed = defaults_listing(statements)
    if listed is not None:
        assert set(listed) == set(DEFAULTS), (
            f"{origin} lists the defaults: it lacks {sorted(set(DEFAULTS) - set(listed))}")
        return
    # The user's own apps a snippet names (the quickstart's "catalog"): empty packages.
    for app in re.findall(r"\"([a-z_]+)\"", statements):
        if re.search(rf"INSTALLED_APPS.*\"{app}\"", statements) and \
                importlib.util.find_spec(app) is None:
            (tmp_path / app).mkdir()
            (tmp_path / app / "__init__.py").write_text("")
    # The user's own store classes a snippet names (DEDUP_JOBS["STORES"]): the suite's
    # third-party store stands in for each (tests/plugin_store.py).
    for module, name in re.findall(r"\"([a-z_]+(?:\.[a-z_]+)+)\.([A-Z]\w*)\"", statements):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            path = tmp_path.joinpath(*module.split("."))
            path.parent.mkdir(parents=True, exist_ok=True)
            for parent in [path.parent, *path.parent.parents]:
                if parent == tmp_path:
                    break
                (parent / "__init__.py").touch()
            path.with_suffix(".py").write_text(
                f"from tests.plugin_store import ShardedStore as {name}\n")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_snippets",
        "DEDUP_JOBS_SNIPPET": EXAMPLE_HOSTS.sub("127.0.0.1", statements),
        "DEDUP_JOBS_SNIPPET_ORIGIN": origin,
        "DEDUP_JOBS_SNIPPET_DB": str(tmp_path / "db.sqlite3"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "django", "check", "--fail-level", "WARNING"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    said = result.stdout + result.stderr
    assert result.returncode == 0, f"{origin}:\n{statements}\n{said}"
    silenced = re.search(r"System check identified no issues \((\d+) silenced\)\.", said)
    assert silenced is not None, said
    # only a snippet that silences a check itself (and says why) may have one silenced
    assert silenced.group(1) == "0" or "SILENCED_SYSTEM_CHECKS" in statements, said
