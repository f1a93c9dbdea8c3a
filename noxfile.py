"""The supported-versions matrix: Python 3.10-3.13 x Django 5.2/6.0/6.1 x Celery 5.5-5.7.

    uv run --group ci nox -l                                      # every session
    uv run --group ci nox -s "tests-3.11(django='5.2', celery='5.7')"
    uv run --group ci nox -t ci_slice                             # what .ci/run runs

Django 6.x needs Python >= 3.12: those combinations are listed and skipped with that reason,
so ``nox -s tests`` shows every cell of the matrix. Virtualenvs are made by uv. Arguments
after ``--`` go to pytest (e.g. ``-- -m "not worker"``). The tests use the same services as
``uv run pytest`` (see ``tests/settings.py``; ``DEDUP_JOBS_TEST_REDIS`` etc. pass through).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["ci_slice-django5.2", "ci_slice-django6.1"]

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
DJANGOS = ["5.2", "6.0", "6.1"]
CELERYS = ["5.5", "5.6", "5.7"]
#: the oldest Python each Django line supports (Django's own support table)
DJANGO_MIN_PYTHON = {"5.2": (3, 10), "6.0": (3, 12), "6.1": (3, 12)}


def _works(executable: str) -> bool:
    try:
        return (
            subprocess.run([executable, "-c", "pass"], capture_output=True, timeout=20).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _expose_pyenv_interpreters() -> None:
    """Make ``python3.X`` resolvable for nox and uv when it is installed by pyenv but not
    selected (a pyenv shim then exits 127): put that version's bin directory on PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    extra: list[str] = []
    for version in PYTHONS:
        found = shutil.which(f"python{version}")
        if found and _works(found):
            continue
        candidates = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin")))
        extra += [d for d in candidates[-1:] if _works(os.path.join(d, f"python{version}"))]
    if extra:
        os.environ["PATH"] = os.pathsep.join([*extra, os.environ.get("PATH", "")])


_expose_pyenv_interpreters()


def _pin(series: str) -> str:
    """``"5.2"`` -> ``"~=5.2.0"``: the latest release of that series."""
    return f"~={series}.0"


def run_tests(session: nox.Session, django: str, celery: str,
              default_args: list[str] | tuple[str, ...] = ()) -> None:
    python = tuple(int(part) for part in str(session.python).split("."))
    needed = DJANGO_MIN_PYTHON[django]
    if python < needed:
        session.skip(f"Django {django} needs Python >= {needed[0]}.{needed[1]}")
    session.install("-e", ".", "--group", "dev", f"django{_pin(django)}", f"celery{_pin(celery)}")
    session.run(
        "python",
        "-c",
        "import django, celery, sys; print('python', "
        "sys.version.split()[0], 'django', django.__version__, 'celery', "
        "celery.__version__)",
    )
    session.run("pytest", "-q", *(session.posargs or default_args))


@nox.session(python=PYTHONS)
@nox.parametrize("celery", CELERYS)
@nox.parametrize("django", DJANGOS)
def tests(session: nox.Session, django: str, celery: str) -> None:
    """The test suite on one cell of the matrix."""
    run_tests(session, django, celery)


@nox.session(python="3.11", name="ci_slice-django5.2", tags=["ci_slice"])
def ci_slice_old(session: nox.Session) -> None:
    """CI slice: the oldest supported Django (5.2) on Python 3.11, Celery 5.7."""
    run_tests(session, "5.2", "5.7")


#: what the newest cell of the CI slice leaves out when given no pytest arguments: the fault
#: injection suites (private redis-servers, proxies, Sentinel) and the Redis Cluster suites.
#: They exercise redis-py, kombu and the store's Lua, which no Django version changes, and
#: take a third of the suite's time; the first cell runs them, with the Django 5.2 line
NEWEST_CELL_LEAVES_OUT = ["--ignore=tests/faults", "--ignore=tests/cluster"]


@nox.session(python="3.12", name="ci_slice-django6.1", tags=["ci_slice"])
def ci_slice_new(session: nox.Session) -> None:
    """CI slice: the newest Django (6.1) on Python 3.12, Celery 5.7 (the suite but the fault
    and cluster suites, unless pytest arguments are given after ``--``)."""
    run_tests(session, "6.1", "5.7", default_args=NEWEST_CELL_LEAVES_OUT)
