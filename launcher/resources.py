"""Where the project's data directories are, in a checkout and when installed as a package.

In a source checkout (or an editable install) they sit beside the package; a wheel carries them
under launcher/_data (see pyproject's force-include). One lookup, used by everything.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    """`schema`, `scripts`, `env`, `recipes` or `templates`, wherever this installation has it."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"the installation of reproduce has no {name}/ directory (looked beside {_PKG})"
    )
