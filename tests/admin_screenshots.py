"""Regenerate the admin's screenshots in docs/img/admin/ (docs/admin.md):

    DEDUP_JOBS_TEST_REDIS=redis://127.0.0.1:6379 uv run python -m tests.admin_screenshots

Every page of the section (Overview, Held locks, Debounced jobs, Throttles, Job classes, the
release confirmation) at 1280x800 and 1920x1080, Django's nav sidebar open, light and dark:
24 PNGs of the viewport, named ``{page}-{width}-{scheme}.png``. They are taken by the layout
test (tests/test_admin_fit.py) on its pages of long names, before it measures them: the
command exits non-zero when a measurement fails. Needs what that test needs: a Redis server and
Debian's Chromium (/usr/bin/chromium). An optional argument names another folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "docs" / "img" / "admin"


def main(argv: list[str]) -> int:
    folder = Path(argv[0]).resolve() if argv else FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    os.environ["DEDUP_JOBS_SCREENSHOTS"] = str(folder)
    os.chdir(ROOT)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_admin_fit.py",
                        "-k", "test_every_page_fits and open"])
    print(f"{len(list(folder.glob('*.png')))} screenshots in {folder}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
