"""transformers is optional: no attnkit module imports it except the transformers integration
(``attnkit/integrations/``), and that one only when one of its functions is first used."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import attnkit

ROOT = Path(attnkit.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_integration_imports_transformers():
    files = [p for p in ROOT.rglob("*.py") if "integrations" not in p.relative_to(ROOT).parts]
    assert len(files) > 50
    bad = [str(p.relative_to(ROOT)) for p in files if "transformers" in imported_modules(p)]
    assert bad == []
    assert "transformers" in imported_modules(ROOT / "integrations" / "hf_closures.py")


def test_importing_the_integration_does_not_import_transformers():
    """... and without transformers, register() says which extra to install."""
    code = (
        "import sys, attnkit, attnkit.functional, attnkit.integrations.transformers as t\n"
        "print(t.NAME, sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
        "sys.modules['transformers'] = None  # as if not installed\n"
        "try:\n    t.register()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "attnkit []"
    assert "pip install 'attnkit[hf]'" in lines[1]
