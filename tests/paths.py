"""Paths shared by tests."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.yaml"))
