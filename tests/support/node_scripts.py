"""Load a node script (scripts/<name>.py) as a module by path, the way nothing in `launcher` may.

The scripts run on the node without the `launcher` package, so tests import them by file path.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support.paths import REPO

SCRIPTS = REPO / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as module `<name>` (cached in sys.modules, so scripts importing each other share it)."""
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(
        SCRIPTS / f"{name}.py"
    ):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
