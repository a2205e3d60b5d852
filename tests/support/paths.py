"""Where things are, for tests in any folder: the repository and tests/ (data, golden, stand-ins)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SEED = (
    REPO / "recipes" / "qwen3-30b-a3b" / "h200" / "attune-tp1-pp1-ep8-mt16k.yaml"
)  # the seed recipe
STANDIN_GPU = TESTS / "standin_gpu"  # the stand-in nvidia-smi (no GPU here; docs/testing.md)
STANDIN_ENROOT = TESTS / "standin_enroot"  # enroot version/import, its cache as enroot keeps it
