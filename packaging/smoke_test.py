"""Smoke test of the built bundle (dist/SpecDeck), headless: does the frozen app run at all?

    .venv/bin/python packaging/smoke_test.py [--bundle dist/SpecDeck] [--model PATH]

Steps, each with a time limit; the first failure stops the run with a message naming the step:
  1. layout    llama.cpp's shared libraries and resources/ are where the code looks for them
  2. doctor    `specdeck doctor --json` parses and names the llama.cpp build (version, commit, backend, CPU)
  3. bench     a short in-process bench on the SmolLM2 demo model with the n-gram drafter
  4. chat      `specdeck chat`, which runs the engine worker as a spawned process of the frozen app
  5. window    the GUI starts on the offscreen platform and either quits by itself (SPECDECK_QUIT_AFTER_MS,
               if the window honours it) or stays up without a traceback until it is stopped
Needs the demo models (`specdeck demo-models`); --model or SPECDECK_SMOKE_MODEL picks another GGUF.
Uses only the standard library, so any Python runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WIN = sys.platform == "win32"
MAC = sys.platform == "darwin"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STEPS = ("layout", "doctor", "bench", "chat", "window")
WINDOW_SECONDS = 8.0  # a window that is up this long without a traceback counts as started


class StepFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[smoke] {message}", flush=True)


def executables(bundle: Path) -> tuple[Path, Path]:
    """(console executable, window executable) of the bundle."""
    suffix = ".exe" if WIN else ""
    cli = bundle / (("specdeck-cli" if (WIN or MAC) else "specdeck") + suffix)
    gui = bundle / ("SpecDeck" + suffix)
    return cli, gui


def run(cmd: list[str], step: str, timeout: float, env: dict[str, str],
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    log("$ " + " ".join(cmd))
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"{step}: no exit within {timeout:.0f} s") from exc
    if done.returncode != 0 or "Traceback (most recent call last)" in done.stderr:
        raise StepFailed(f"{step}: exit status {done.returncode}\n--- stdout\n{done.stdout[-3000:]}"
                         f"\n--- stderr\n{done.stderr[-3000:]}")
    return done


def find_model(bundle_cli: Path, env: dict[str, str]) -> Path:
    """The SmolLM2 demo model: from .venv (installed_demo_models), else from the bundle's demo-models."""
    venv_python = ROOT / ".venv" / ("Scripts/python.exe" if WIN else "bin/python")
    candidates: list[str] = []
    if venv_python.exists():
        done = subprocess.run(
            [str(venv_python), "-c",
             "from app.library.demo_install import installed_demo_models as f; print('\\n'.join(map(str, f())))"],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )
        candidates += done.stdout.split()
    if not any(Path(c).name == DEMO_FILE for c in candidates):
        # Prints the paths when the models are installed (it would try to fetch them otherwise).
        done = subprocess.run([str(bundle_cli), "demo-models"], capture_output=True, text=True, env=env,
                              timeout=60)
        candidates += done.stdout.split()
    for candidate in candidates:
        if Path(candidate).name == DEMO_FILE and Path(candidate).is_file():
            return Path(candidate)
    raise StepFailed(f"setup: the demo model {DEMO_FILE} is not installed; run `specdeck demo-models` "
                     "(or pass --model PATH)")


def build_info(data: Any) -> dict[str, Any] | None:
    """The first object in a JSON tree that describes the llama.cpp build (has ``ggml_commit``)."""
    if isinstance(data, dict):
        if "ggml_commit" in data:
            return data
        children: list[Any] = list(data.values())
    elif isinstance(data, list):
        children = data
    else:
        return None
    for child in children:
        found = build_info(child)
        if found is not None:
            return found
    return None


def step_layout(bundle: Path) -> None:
    internal = bundle / "_internal"
    libs = internal / "llama_cpp" / "lib"
    names = {"libllama.so", "libllama.dylib", "llama.dll", "libllama.dll"}
    if not libs.is_dir() or not any((libs / n).exists() for n in names):
        raise StepFailed(f"layout: no llama library in {libs} (collect_dynamic_libs('llama_cpp') missing?)")
    for data in ("resources/demo_models.json", "resources/prompts/edit.jsonl"):
        if not (internal / data).is_file():
            raise StepFailed(f"layout: {data} is missing from {internal}")
    log(f"layout: ok ({', '.join(sorted(p.name for p in libs.iterdir()))})")


def step_doctor(cli: Path, env: dict[str, str]) -> None:
    done = run([str(cli), "doctor", "--json"], "doctor", 180, env)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise StepFailed(f"doctor: --json did not print JSON ({exc}):\n{done.stdout[:2000]}") from exc
    # The llama.cpp build the bundle carries (hardware.BackendInfo): the About box shows the same.
    wanted = ("llama_cpp_python", "llama_cpp", "ggml_commit", "backend", "cpu_features")
    info = build_info(report) or {}
    missing = [key for key in wanted if not info.get(key)]
    if missing:
        raise StepFailed(f"doctor: --json lacks the llama.cpp build info {missing}; top-level keys: "
                         f"{sorted(report) if isinstance(report, dict) else type(report).__name__}")
    features = info["cpu_features"]
    shown = " ".join(features) if isinstance(features, list) else features
    log(f"doctor: ok (specdeck {report.get('specdeck', '?')}, llama-cpp-python {info['llama_cpp_python']}, "
        f"llama.cpp {info['llama_cpp']}, ggml commit {info['ggml_commit']}, backend {info['backend']}, "
        f"CPU {shown})")
    modules = info.get("modules") or []
    devices = ", ".join(f"{d.get('name')} ({d.get('description')})" for d in info.get("devices") or [])
    if modules:
        # A bundle with loadable backends: which CPU variant this machine got, and which backends loaded.
        cpu = next((m for m in modules if "ggml-cpu" in m), None)
        log(f"doctor: backends loaded from the bundle: {', '.join(modules)} (CPU variant: {cpu or 'none'}); "
            f"devices: {devices}")
        if cpu is None:
            raise StepFailed("doctor: a bundle with loadable backends loaded no CPU backend")
    else:
        log(f"doctor: backends linked into llama.cpp; devices: {devices}")


def step_bench(cli: Path, model: Path, env: dict[str, str], tmp: Path) -> None:
    prompts = next((cli.parent / "_internal" / "resources" / "prompts").glob("edit.jsonl"), None)
    if prompts is None:
        prompts = ROOT / "resources" / "prompts" / "edit.jsonl"
    out = tmp / "bench.json"
    done = run([str(cli), "bench", "--target", str(model), "--ngram", "3", "--max-tokens", "8",
                "--threads", "1", "--prompts", str(prompts), "--json", str(out)], "bench", 600, env)
    try:
        report = json.loads(out.read_text())
        tokens = [p["tokens"] for p in report["prompts"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StepFailed(f"bench: no usable --json report ({exc}):\n{done.stdout[-2000:]}") from exc
    if not tokens or min(tokens) < 1:
        raise StepFailed(f"bench: a prompt produced no tokens: {tokens}")
    log(f"bench: ok ({report['total']['tok_s']:.1f} tok/s, backend {report.get('backend')}, tokens {tokens})")


def step_chat(cli: Path, model: Path, env: dict[str, str]) -> None:
    cmd = [str(cli), "chat", "--target", str(model), "--max-tokens", "4"]
    done = run(cmd, "chat", 300, env, stdin="hi\n")
    lines = [line for line in done.stdout.splitlines() if not line.startswith("[")]
    answer = " ".join(line.lstrip("> ").strip() for line in lines).strip()
    if not answer:
        raise StepFailed(f"chat: the engine worker gave no answer\n--- stdout\n{done.stdout}\n"
                         f"--- stderr\n{done.stderr[-3000:]}")
    log(f"chat: ok (answer {answer!r})")


def step_window(gui: Path, env: dict[str, str]) -> None:
    env = dict(env, QT_QPA_PLATFORM="offscreen", SPECDECK_QUIT_AFTER_MS="2000")
    log(f"$ QT_QPA_PLATFORM=offscreen SPECDECK_QUIT_AFTER_MS=2000 {gui}")
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([str(gui)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, text=True, start_new_session=not WIN)
        start = time.monotonic()
        try:
            code: int | None = proc.wait(WINDOW_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
            # Still up: stop the window and any engine worker it started (its own process group).
            if WIN:
                proc.kill()
            else:
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                if not WIN:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        out.seek(0)
        text = out.read()
    seconds = time.monotonic() - start
    if "Traceback (most recent call last)" in text or (code is not None and code != 0):
        raise StepFailed(f"window: exit status {code} after {seconds:.1f} s\n--- output\n{text[-3000:]}")
    how = "quit by itself" if code == 0 else f"up {WINDOW_SECONDS:.0f} s without a traceback, then stopped"
    log(f"window: ok ({how})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    # On macOS too: dist/SpecDeck is the onedir folder that SpecDeck.app is made from.
    parser.add_argument("--bundle", type=Path, default=ROOT / "dist" / "SpecDeck", help="the bundle folder")
    parser.add_argument("--model", type=Path, default=os.environ.get("SPECDECK_SMOKE_MODEL"),
                        help="GGUF to run (default: the SmolLM2 demo model)")
    parser.add_argument("--skip", action="append", default=[], choices=STEPS,
                        help="leave out a step (repeatable; for diagnosis, never in CI)")
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    cli, gui = executables(bundle)
    if not cli.exists():
        log(f"FAILED at setup: no {cli}; build with packaging/build first")
        return 1
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="specdeck-smoke-") as tmp:
            env = dict(os.environ)
            model = args.model or find_model(cli, env)
            if not model.is_file():
                raise StepFailed(f"setup: no model at {model}")
            # Settings, history and logs of this run go to a scratch folder, not the user's.
            env["SPECDECK_HOME"] = tmp
            env["SPECDECK_MODELS_DIR"] = str(model.parent)
            env.pop("PYTHONPATH", None)
            steps = {
                "layout": lambda: step_layout(bundle),
                "doctor": lambda: step_doctor(cli, env),
                "bench": lambda: step_bench(cli, model, env, Path(tmp)),
                "chat": lambda: step_chat(cli, model, env),
                "window": lambda: step_window(gui, env),
            }
            for name, step in steps.items():
                if name in args.skip:
                    log(f"{name}: SKIPPED")
                    continue
                step()
    except StepFailed as exc:
        log(f"FAILED at {exc}")
        return 1
    log(f"all steps passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
