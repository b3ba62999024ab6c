#!/usr/bin/env python3
"""Screenshot of the window's Find models view in a real X window (Xvfb): a search, and one repository's quants
with the fit and the predicted speed read from their remote headers. The Hub is the tests' look-alike on
loopback (tests/hub_lookalike.py) serving the demo models' real GGUF files beside a large model's header, so
nothing reaches the network.

    .venv/bin/python packaging/screenshot_hub.py [--out /tmp/find-models.png] [--size 1366x768]

Needs Xvfb, ImageMagick's `import` and Qt's X11 libraries (see packaging/screenshot.py). Uses a scratch
SPECDECK_HOME and models folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
WAIT_MS = 120_000  # a bound on a hung request, not a measurement


def _wait(signal: object, timeout_ms: int) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    signal.connect(loop.quit)  # type: ignore[attr-defined]
    QTimer.singleShot(timeout_ms, loop.quit)
    loop.exec()


def _settle(ms: int) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def window_side(out: Path, width: int, height: int, home: Path) -> int:
    """In the child on the X display: serve the look-alike, open the view, search, choose, screenshot."""
    from PySide6.QtWidgets import QApplication

    from app.library.demo_install import install_demo_models
    from tests.hub_lookalike import HubLookalike, big_model_header
    from ui.main_window import MainWindow
    from ui.notifier import Notifier

    smollm2, gemma = install_demo_models()
    hub = HubLookalike()
    os.environ["HF_ENDPOINT"] = hub.url
    hub.add_file(REPO, "SmolLM2-135M-Instruct-Q4_1.gguf", smollm2)
    hub.add_file(REPO, "SmolLM2-135M-Instruct.imatrix.gguf", smollm2)
    hub.add_file(REPO, "mmproj-SmolLM2-135M-F16.gguf", smollm2)
    big, big_size = big_model_header(home / "big70")
    hub.add_header_only(REPO, "Llama-70B-F16.gguf", big, big_size)  # a quant that does not fit here
    hub.add_file("google/gemma-3-270m-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma)
    hub.repos[REPO].downloads, hub.repos[REPO].likes = 48_210, 112

    app = QApplication([sys.argv[0]])
    window = MainWindow(notifier=Notifier(modal=False), start_engine=False)
    window.resize(width, height)
    window.show()
    window.find_models.action.trigger()
    dialog = window.find_models.dialog
    assert dialog is not None
    dialog.query_edit.setText("gguf")
    dialog.search_button.click()
    _wait(dialog.searched, WAIT_MS)
    index = [h.repo for h in dialog.hits].index(REPO)
    dialog.repo_tree.setCurrentItem(dialog.repo_tree.topLevelItem(index))
    _wait(dialog.judged, WAIT_MS)
    _settle(1500)  # the drafters line and the layout
    subprocess.run(["import", "-window", "root", str(out)], check=True)
    print(f"saved {out}")
    window.close()
    hub.close()
    app.quit()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/find-models.png"))
    parser.add_argument("--size", default="1366x768", help="screen and window size, WIDTHxHEIGHT")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.lower().split("x"))
    if args.child:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        return window_side(args.out.resolve(), width, height, Path(os.environ["SPECDECK_HOME"]))
    for tool in ("Xvfb", "import"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (Debian: apt-get install xvfb imagemagick).", file=sys.stderr)
            return 1
    read_end, write_end = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_end), "-screen", "0", f"{width}x{height}x24"],
                            pass_fds=(write_end,))
    os.close(write_end)
    display = os.read(read_end, 16).decode().strip()
    os.close(read_end)
    try:
        with tempfile.TemporaryDirectory(prefix="specdeck-hub-shot-") as home:
            env = {**os.environ, "DISPLAY": f":{display}", "QT_QPA_PLATFORM": "xcb", "SPECDECK_HOME": home,
                   "SPECDECK_MODELS_DIR": str(Path(home) / "models"), "HF_HOME": str(Path(home) / "hf")}
            env.pop("HF_TOKEN", None)
            child = [sys.executable, __file__, "--child", "--out", str(args.out), "--size", args.size]
            return subprocess.run(child, env=env, cwd=ROOT, check=False).returncode
    finally:
        xvfb.terminate()
        xvfb.wait()


if __name__ == "__main__":
    raise SystemExit(main())
