"""Repository paths the tests read, independent of where a test module sits."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
