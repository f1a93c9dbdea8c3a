"""The reference pages stay in step with the code: every system check id and every
``DEDUP_JOBS`` key is documented once, and nothing documented is gone from the code."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from dedup_jobs.conf import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dedup_jobs"
CHECKS_MD = ROOT / "docs" / "checks.md"
SETTINGS_MD = ROOT / "docs" / "settings.md"

ID_LITERAL = re.compile(r"dedup_jobs\.([EW]\d{3})\b")
HELPERS = {"_error": "E", "_warning": "W"}
# A heading that documents a check id: "### dedup_jobs.E001 {#e001}".
CHECK_HEADING = re.compile(r"^#{2,6}\s+`?dedup_jobs\.([EW]\d{3})`?", re.MULTILINE)
# A heading that documents a setting: "### `STORE` {#store}".
SETTING_HEADING = re.compile(r"^#{2,6}\s+`([A-Z][A-Z0-9_]*)`", re.MULTILINE)


def check_ids_in_source(source: str) -> dict[str, set[str]]:
    """Check ids a module emits, each with the functions that emit it: calls of the
    ``_error(4, ...)`` / ``_warning(1, ...)`` helpers and ``"dedup_jobs.E004"`` literals."""
    tree = ast.parse(source)
    found: dict[str, set[str]] = {}

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            level = HELPERS.get(node.func.id)
            first = node.args[0] if node.args else None
            if level and isinstance(first, ast.Constant) and isinstance(first.value, int):
                found.setdefault(f"{level}{first.value:03d}", set()).add(function)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in ID_LITERAL.finditer(node.value):
                found.setdefault(match.group(1), set()).add(function)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def code_check_ids() -> dict[str, set[str]]:
    """Every check id emitted anywhere in the package, with ``module:function`` users."""
    ids: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        module = path.relative_to(ROOT).as_posix()
        for check_id, functions in check_ids_in_source(path.read_text("utf-8")).items():
            ids.setdefault(check_id, set()).update(f"{module}:{f}" for f in functions)
    return ids


def documented(pattern: re.Pattern[str], page: Path) -> Counter[str]:
    return Counter(pattern.findall(page.read_text("utf-8")))


def test_parser_finds_helper_calls_and_literals() -> None:
    """The id scanner sees both ways a check id is written (so the tests below can fail)."""
    source = (
        "def check_a():\n"
        "    return [_error(4, 'x', 'y'), _warning(12, 'x', 'y')]\n"
        "def check_b():\n"
        "    return checks.Error('x', id='dedup_jobs.E007')\n"
    )
    assert check_ids_in_source(source) == {
        "E004": {"check_a"},
        "W012": {"check_a"},
        "E007": {"check_b"},
    }


def test_checks_py_ids_are_found() -> None:
    """A3: the scanner finds the ids checks.py defines (E001-E006, W001-W002 at least)."""
    ids = code_check_ids()
    assert {"E001", "E002", "E003", "E004", "E005", "E006", "W001", "W002"} <= set(ids)


def test_every_check_id_is_documented() -> None:
    """A3: every system check id used in dedup_jobs/ has a heading in docs/checks.md."""
    missing = sorted(set(code_check_ids()) - set(documented(CHECK_HEADING, CHECKS_MD)))
    assert not missing, f"check ids missing from docs/checks.md: {missing}"


def test_no_documented_check_id_is_gone() -> None:
    """A3: every id documented in docs/checks.md still exists in the code."""
    gone = sorted(set(documented(CHECK_HEADING, CHECKS_MD)) - set(code_check_ids()))
    assert not gone, f"docs/checks.md documents ids the code no longer has: {gone}"


def test_no_check_id_is_documented_twice() -> None:
    """A3: each id has exactly one heading in docs/checks.md."""
    twice = sorted(i for i, n in documented(CHECK_HEADING, CHECKS_MD).items() if n > 1)
    assert not twice, f"check ids documented more than once: {twice}"


def test_every_setting_is_documented() -> None:
    """Every DEDUP_JOBS key in conf.DEFAULTS has a heading in docs/settings.md."""
    missing = sorted(set(DEFAULTS) - set(documented(SETTING_HEADING, SETTINGS_MD)))
    assert not missing, f"DEDUP_JOBS keys missing from docs/settings.md: {missing}"


def test_no_documented_setting_is_gone_or_twice() -> None:
    """docs/settings.md documents only keys that exist, each once."""
    headings = documented(SETTING_HEADING, SETTINGS_MD)
    gone = sorted(set(headings) - set(DEFAULTS))
    twice = sorted(k for k, n in headings.items() if n > 1)
    assert not gone, f"docs/settings.md documents keys conf.DEFAULTS lacks: {gone}"
    assert not twice, f"settings documented more than once: {twice}"
