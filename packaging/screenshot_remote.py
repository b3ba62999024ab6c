#!/usr/bin/env python3
"""The window's Remote engine dock watching a real server on 127.0.0.1, in Xvfb, saved as a PNG.

    .venv/bin/python packaging/screenshot_remote.py [--engine llama-server|specdeck]
        [--out resources/screenshot-remote.png] [--seconds 40]

Starts the llama-server built by packaging/build_llama_server (or `specdeck serve`) on the SmolLM2 demo
model with metrics and n-gram speculation, opens SpecDeck (no local engine) under Xvfb, connects it to the
server (Model → Connect to server…), chooses the server's model in the picker and chats with the edit
prompts through it while the dock plots the server's counters, then grabs the window while an answer
streams. Needs Xvfb and Qt's X11 libraries (see packaging/screenshot.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [json.loads(line) for line in (ROOT / "resources/prompts/edit.jsonl").read_text().splitlines() if line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(url: str, out: Path, seconds: float, size: tuple[int, int]) -> int:
    """Runs inside Xvfb: the window connected to ``url``, its chat on the server's model (chosen in the
    picker, where it is listed as remote) sending the edit prompts one after another, so the dock plots the
    server's counters while answers stream; the grab waits for an answer in progress."""
    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtWidgets import QApplication

    from ui.main_window import MainWindow

    app = QApplication([])
    window = MainWindow(start_engine=False)
    window.resize(*size)
    window.show()
    window.dashboard_dock.hide()
    picker, chat = window.picker, window.chat
    state = {"next": 0, "stop": False}

    def ask() -> None:
        if state["stop"] or chat.generating:
            return
        prompt = PROMPTS[state["next"] % len(PROMPTS)]["messages"][-1]["content"]
        state["next"] += 1
        chat.new_chat()
        chat.send(prompt)

    def choose_remote() -> None:
        if not picker.remote_models:
            QTimer.singleShot(200, choose_remote)
            return
        picker.select_remote(picker.remote_models[0])
        window.sampling_form.set_value("temperature", 0)
        window.sampling_form.set_value("max_tokens", 64)  # short: tok/s moves with each answer
        window.resizeDocks([window.remote.dock], [int(size[0] * 0.45)], Qt.Orientation.Horizontal)
        chat.answer_finished.connect(lambda _answer: QTimer.singleShot(300, ask))
        ask()

    window.remote.connect_to(url)
    choose_remote()
    deadline = time.monotonic() + seconds + 60

    def grab() -> None:
        if not chat.generating and time.monotonic() < deadline:
            QTimer.singleShot(100, grab)  # the shot shows an answer streaming
            return
        state["stop"] = True
        window.remote.dashboard.timer.stop()
        window.grab().save(str(out))
        print(f"picker: {picker.target_combo.currentText()}")
        print(f"dock: {window.remote.dashboard.header.text()}")
        for key, label in window.remote.dashboard.values.items():
            print(f"  {key}: {label.text()}")
        print(f"  sources: {window.remote.dashboard.sources.text()}")
        print(f"answers sent: {state['next']}; streaming at the shot: {chat.generating}")
        window.close()
        app.quit()

    QTimer.singleShot(int(seconds * 1000), grab)
    app.exec()
    return 0 if out.exists() else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "screenshot-remote.png")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the dock watches before the shot")
    parser.add_argument("--size", default="1500x900")
    parser.add_argument("--engine", choices=("llama-server", "specdeck"), default="llama-server")
    parser.add_argument("--child", nargs=2, metavar=("URL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.lower().split("x"))
    if args.child:
        return child(args.child[0], Path(args.child[1]), args.seconds, (width, height))

    from app.library.demo_install import install_demo_models

    built = subprocess.run([sys.executable, str(ROOT / "packaging" / "build_llama_server"), "--print"],
                           capture_output=True, text=True)
    if args.engine == "llama-server" and built.returncode != 0:
        print("llama-server is not built: run packaging/build_llama_server first.", file=sys.stderr)
        return 1
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        print("Xvfb is not installed (Debian: apt-get install xvfb).", file=sys.stderr)
        return 1
    smollm2, _gemma = install_demo_models()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    display = ":94"
    if args.engine == "llama-server":
        command = [built.stdout.strip(), "-m", str(smollm2), "--host", "127.0.0.1", "--port", str(port), "--metrics",
                   "--slots", "-c", "4096", "-np", "1", "-t", "1", "--spec-type", "ngram-simple"]
    else:
        command = [sys.executable, "-m", "app", "serve", "--target", str(smollm2), "--port", str(port), "--ngram", "3",
                   "--k", "4", "--no-history"]  # a fixed depth: loading times 5 draft widths, not 17
    llama = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    screen = subprocess.Popen([xvfb, display, "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import httpx

        deadline = time.monotonic() + 600  # loading and timing the model takes minutes on a busy machine
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if llama.poll() is not None or time.monotonic() > deadline:
                print(f"{args.engine} did not start.", file=sys.stderr)
                return 1
            time.sleep(0.3)
        with tempfile.TemporaryDirectory(prefix="specdeck-shot-") as home:
            shot = Path(home) / "shot.png"
            env = dict(os.environ, DISPLAY=display, SPECDECK_HOME=home, SPECDECK_MODELS_DIR=str(smollm2.parent),
                       QT_QPA_PLATFORM="xcb", PYTHONUNBUFFERED="1")
            done = subprocess.run([sys.executable, __file__, "--child", url, str(shot), "--seconds",
                                   str(args.seconds), "--size", args.size], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=600)
            print(done.stdout)
            if not shot.exists():
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, args.out)
            print(f"saved {args.out}")
    finally:
        for proc in (llama, screen):
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
