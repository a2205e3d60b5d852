"""The node programs' modules (scripts/), loaded by name from wherever this installation keeps them.

The manifest, the store clients (directory, S3 through boto3 or the aws CLI) and the Hub client
run on the node without this package, so they live in scripts/ (docs/node-scripts.md); the
launcher loads the very same files rather than keeping a second copy that could drift. The
scripts directory is appended to sys.path once (the scripts import their siblings by name).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from launcher.resources import data_dir


def node_module(name: str) -> ModuleType:
    """scripts/<name>.py as a module (asset_spec, asset_store, asset_resolve, node_assets ...)."""
    scripts = str(data_dir("scripts"))
    if scripts not in sys.path:
        sys.path.append(scripts)
    return importlib.import_module(name)
