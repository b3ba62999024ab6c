"""The layers: app/ is plain Python and never imports Qt or ui (the GUI depends on app, never the reverse);
only app.cli's own modules import a command; the GUI process never loads llama.cpp (the engine worker
does); the probes' child-process plumbing imports the standard library alone."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("PySide6", "shiboken6", "pyqtgraph", "ui")
# Every package of app/ (and the top-level modules) is scanned; a new package must be added here, so the
# layering rules below are thought through for it.
PACKAGES = ("app.ceiling", "app.cli", "app.engine", "app.library", "app.serve", "app.storage")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_module_in_app_imports_qt_or_ui() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    ]
    assert offenders == []


def test_the_scan_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom PySide6.QtCore import QObject\nimport ui.main\n")
    assert [n for n in _imports(bad) if n.split(".")[0] in FORBIDDEN] == ["PySide6.QtCore", "ui.main"]


def test_every_app_module_imports_with_qt_blocked() -> None:
    """Import all of app/ in a fresh interpreter where importing Qt or ui raises."""
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "app").rglob("*.py")
        if p.name != "__main__.py"
    )
    blocker = (
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {FORBIDDEN!r}:\n"
        "            raise ImportError('app imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    assert _import_in_fresh_python(modules, before=blocker).startswith("ok")


def _import_in_fresh_python(modules: list[str], before: str = "") -> str:
    """Import ``modules`` in a new interpreter (after running ``before``); its stdout: "ok", the number of
    modules loaded, and whether llama_cpp is among them."""
    script = (
        "import importlib, sys\n" + before
        + f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print('ok', len(sys.modules), 'llama_cpp' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _app_modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (ROOT / "app").rglob("*.py")}


def test_every_package_of_app_is_known() -> None:
    packages = {name for name, path in _app_modules().items() if path.name == "__init__.py" and name != "app"}
    assert packages == set(PACKAGES)


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "app.cli"])
def test_only_the_commands_import_a_command(package: str) -> None:
    """The engine, the ceiling, the library, storage and serving never import app.cli: a command is the
    top of the stack (bench once imported its ceiling from doctor)."""
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for module, path in sorted(_app_modules().items())
        if module == package or module.startswith(package + ".")
        for name in _imports(path)
        if name == "app.cli" or name.startswith("app.cli.")
    ]
    assert offenders == []


def test_the_probe_plumbing_imports_the_standard_library_alone() -> None:
    """The frozen app's entry point reads PROBE_FLAG from app.ceiling.child before anything else loads."""
    names = _imports(ROOT / "app" / "ceiling" / "child.py")
    assert names
    assert [n for n in names if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"] == []


def test_the_engine_and_the_ceiling_never_load_llama_cpp_at_import() -> None:
    """Importing any app module leaves llama_cpp unloaded; only the worker's session, the backend probe
    and the llama wrapper load it, when they run."""
    loaders = {"app.engine.llama", "app.engine.session", "app.engine.speculative", "app.engine.drafters",
               "app.engine.bench", "app.engine.mtp", "app.engine.eagle3",
               "app.engine.dflash"}
    modules = sorted(m for m, p in _app_modules().items() if p.name != "__main__.py" and m not in loaders)
    assert _import_in_fresh_python(modules).endswith("False")


GUI_RUN = """
import sys
from ui.launch import main
code = main([])
print("gui-process llama_cpp loaded:", "llama_cpp" in sys.modules, flush=True)
print("soak modules:", sorted(m for m in sys.modules if m.startswith("ui.soak.")), flush=True)
sys.exit(code)
"""


@pytest.mark.slow
def test_the_gui_process_never_loads_llama_cpp(tiny_target: Path, tmp_path: Path) -> None:
    """The real window, offscreen, loads a tiny model through the engine worker and answers a prompt; the
    window's own process never imports llama_cpp."""
    pytest.importorskip("PySide6")
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"), SPECDECK_MODELS_DIR=str(tiny_target.parent),
               QT_QPA_PLATFORM="offscreen", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    env["SPECDECK_AUTOPILOT"] = json.dumps({
        "target": str(tiny_target), "ngram": 0, "threads": 1, "n_ctx": 256, "prompts": ["Hello"],
        "max_tokens": 8, "quit": True,
    })
    done = subprocess.run([sys.executable, "-c", GUI_RUN], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-3000:]
    assert "autopilot: loaded tiny-target" in out, out[-3000:]
    assert "autopilot: finished" in out, out[-3000:]
    assert "gui-process llama_cpp loaded: False" in out
    assert "soak modules: ['ui.soak.autopilot', 'ui.soak.stall_watch']" in out  # asked for, so loaded


def test_a_plain_start_never_loads_the_soak_harness(tmp_path: Path) -> None:
    """The window opens and closes without SPECDECK_AUTOPILOT: the autopilot and the stall watch stay unloaded
    (the test above sees them load when the variable asks)."""
    pytest.importorskip("PySide6")
    env = {k: v for k, v in os.environ.items() if k != "SPECDECK_AUTOPILOT"}
    env.update(SPECDECK_HOME=str(tmp_path / "home"), SPECDECK_MODELS_DIR=str(tmp_path / "models"),
               QT_QPA_PLATFORM="offscreen", SPECDECK_QUIT_AFTER_MS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", GUI_RUN], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "soak modules: []" in done.stdout, done.stdout[-3000:]
