"""The layers: app's packages import only the layers below them and app never imports Qt or ui (import-linter's
contracts in pyproject.toml); the GUI process never loads llama.cpp (the engine worker does) and a plain
start never loads the soak harness; the probes' child-process plumbing imports the standard library alone."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from importlinter import api

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = api.read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
FORBIDDEN = tuple(next(c["forbidden_modules"] for c in CONTRACTS if c["type"] == "forbidden"))  # Qt and ui


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts (pyproject.toml's [tool.importlinter]) on the ``app`` package under ``root``."""
    script = ("import sys\nfrom importlinter.cli import lint_imports\n"
              "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))\n")
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_layer_contracts_hold() -> None:
    """Each package of app/ imports only the layers below it (imports inside functions count), so there is no
    cycle between packages, and app never imports Qt or ui."""
    done = _lint_imports(ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in done.stdout, done.stdout[-4000:]


@pytest.mark.parametrize(("module", "source", "broken"), [
    ("app/storage/upward.py", "def later():\n    from app.engine.client import EngineClient\n",
     "app.storage.upward -> app.engine.client"),
    ("app/params_events.py", "from app.events import Token\n", "app.params_events"),
    ("app/ceiling/window.py", "import PySide6.QtCore\n", "app.ceiling.window -> PySide6"),
], ids=["lazy-upward-import", "module-outside-the-layers", "qt-import"])
def test_the_contracts_see_a_violation(tmp_path: Path, module: str, source: str, broken: str) -> None:
    """The same contracts on a copy of app/ with one bad module added: an import of a higher layer inside a
    function, a top-level module no layer names, and a Qt import each break them."""
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / module).write_text(source, encoding="utf-8")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout[-4000:]
    assert broken in done.stdout, done.stdout[-4000:]


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


def test_the_probe_plumbing_imports_the_standard_library_alone() -> None:
    """The frozen app's entry point reads PROBE_FLAG from app.ceiling.child before anything else loads."""
    names = _imports(ROOT / "app" / "ceiling" / "child.py")
    assert names
    assert [n for n in names if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"] == []


def test_the_engine_and_the_ceiling_never_load_llama_cpp_at_import() -> None:
    """Importing any app module leaves llama_cpp unloaded; only the worker's session, the backend probe
    and the llama wrapper load it, when they run."""
    loaders = {"app.engine.llama", "app.engine.session", "app.engine.speculative", "app.engine.drafters",
               "app.measure.bench", "app.engine.mtp", "app.engine.eagle3",
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


CYCLE_FINDER = """
import json, sys
import grimp
package = sys.argv[1]
graph = grimp.build_graph("app", cache_dir=None)
inside = {m for m in graph.modules if m.startswith(package + ".")}
edges = {m: sorted(n for n in graph.find_modules_directly_imported_by(m) if n in inside) for m in inside}
state, path = {}, []
def visit(m):
    state[m] = "open"
    path.append(m)
    for n in edges[m]:
        if state.get(n) == "open":
            return path[path.index(n):] + [n]
        if n not in state and (found := visit(n)):
            return found
    path.pop()
    state[m] = "done"
    return None
cycle = next((c for m in sorted(inside) if m not in state and (c := visit(m))), None)
print(json.dumps({"modules": len(inside), "cycle": cycle}))
"""


def _first_cycle(root: Path, package: str) -> tuple[int, list[str] | None]:
    """The modules of ``package`` under ``root`` and the first import cycle among them (imports inside functions
    count, as grimp reads them), or None."""
    done = subprocess.run([sys.executable, "-c", CYCLE_FINDER, package], cwd=root, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return report["modules"], report["cycle"]


@pytest.mark.parametrize("package", sorted(
    f"app.{p.name}" for p in (ROOT / "app").iterdir() if (p / "__init__.py").is_file()))
def test_no_import_cycle_between_the_modules_of_a_package(package: str) -> None:
    """Inside each package of app/ too, no module reaches itself through imports, even lazy ones: the engine
    once went client → worker → bench → doctor_report → decode_check → client (bench's parent side now lives in
    app/measure, its worker side in app/engine/bench_run.py)."""
    modules, cycle = _first_cycle(ROOT, package)
    assert modules > 0
    assert cycle is None, " → ".join(cycle or [])


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path: Path) -> None:
    """The same check on a copy of app/ where the decoder imports the session inside a function."""
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "app" / "engine" / "speculative.py").open("a", encoding="utf-8") as module:
        module.write("\n\ndef _later() -> None:\n    from app.engine.session import EngineSession  # noqa: F401\n")
    _modules, cycle = _first_cycle(tmp_path, "app.engine")
    assert cycle is not None
    assert "app.engine.session" in cycle, cycle
    assert "app.engine.speculative" in cycle, cycle
