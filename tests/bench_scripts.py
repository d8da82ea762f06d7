"""The benchmark scripts (scripts/*.py) as modules, for the tests of their pure parts and of
their quick runs. scripts/ is not a package: each script imports its siblings as top-level
modules, since scripts/ is sys.path[0] when it runs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(name: str) -> ModuleType:
    """scripts/<name>.py imported as the module `name` (once: later calls return the same
    module), with scripts/ on sys.path only while it and its siblings are imported."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPTS))
