"""Where things are, for tests in any folder: the repository and tests/ (data, golden, stand-ins)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
