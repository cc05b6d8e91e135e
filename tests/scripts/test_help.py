"""Every script in scripts/ imports against the current package and answers --help, and
every script the docs, the sources and the tests name is there (a line that calls it
retired, or points into git history, names one that is gone on purpose)."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sorted((ROOT / "scripts").rglob("*.py"))
SHELL = sorted((ROOT / "scripts").rglob("*.sh"))
NAMED = re.compile(r"scripts/[\w/]+\.(?:py|sh)\b")
GONE = re.compile(r"retired|git history|git show")


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", PYTHON, ids=lambda p: p.name)
def test_python_script_imports_and_helps(path, capsys):
    module = _load(path)
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_shell_script_helps(path):
    r = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_every_script_named_exists():
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("*.py"),
             *(p for p in (ROOT / "tests").rglob("*") if p.suffix in (".py", ".md"))]
    named = {(m.group(0), p.relative_to(ROOT)) for p in texts
             for line in p.read_text(errors="replace").splitlines() if not GONE.search(line)
             for m in NAMED.finditer(line)}
    missing = sorted(f"{p}: {s}" for s, p in named if not (ROOT / s).exists())
    assert PYTHON and not missing, missing
