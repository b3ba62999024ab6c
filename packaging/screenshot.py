#!/usr/bin/env python3
"""Start SpecDeck in a real X window (Xvfb) on a demo model, send a prompt, save a screenshot.

    .venv/bin/python packaging/screenshot.py [--out resources/screenshot.png] [--model gemma|smollm2]
        [--size 1366x768]

Needs Xvfb and Qt's X11 libraries (Debian: apt-get install xvfb libxcb-cursor0 libxkbcommon-x11-0
libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxcb-render-util0 libxcb-image0 libegl1 libgl1).
Uses a scratch SPECDECK_HOME, so your settings and chats are untouched. The Vulkan screenshot (llvmpipe, about
five minutes at a second a pass):

    GGML_VK_VISIBLE_DEVICES=0 .venv-vulkan/bin/python packaging/screenshot.py --model smollm2 --n-ctx 2048 \
        --prompt "Name three colours." --max-tokens 14 --size 1680x1400 --out resources/screenshot-vulkan.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.library.demo_install import install_demo_models  # noqa: E402

PROMPT = json.loads((ROOT / "resources/prompts/edit.jsonl").read_text().splitlines()[0])["messages"][0]["content"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "resources" / "screenshot.png")
    parser.add_argument("--model", choices=("gemma", "smollm2"), default="gemma")
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--prompt", default=PROMPT, help="the message to send (default: the first edit prompt)")
    parser.add_argument("--n-ctx", type=int, default=4096, help="context size to load the model with")
    parser.add_argument("--size", default="1800x1000", help="screen and window size, WIDTHxHEIGHT")
    parser.add_argument("--fresh", action="store_true", help="the window as a fresh start shows it (no load)")
    parser.add_argument("--highlight", action="store_true", help="tint the drafted tokens")
    parser.add_argument("--after", choices=("reopen", "message_menu"), default=None,
                        help="before the screenshot: reopen the chat (as a later start shows it), or open the "
                             "newest answer's message menu")
    parser.add_argument("--serve", action="store_true",
                        help="serve the model (Model → Serve) and answer through it, with the Remote engine dock")
    args = parser.parse_args()
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        print("Xvfb is not installed (Debian: apt-get install xvfb).", file=sys.stderr)
        return 1
    smollm2, gemma = install_demo_models()
    target = gemma if args.model == "gemma" else smollm2
    width, height = (int(x) for x in args.size.lower().split("x"))
    # Xvfb picks a free display and writes its number to the pipe (several screenshots may run at once).
    read_end, write_end = os.pipe()
    server = subprocess.Popen([xvfb, "-displayfd", str(write_end), "-screen", "0", f"{width}x{height}x24",
                               "-nolisten", "tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              pass_fds=(write_end,))
    os.close(write_end)
    try:
        with os.fdopen(read_end) as number:
            display = f":{number.readline().strip()}"
        time.sleep(0.5)
        with tempfile.TemporaryDirectory(prefix="specdeck-shot-") as home:
            shot = Path(home) / "shot.png"
            env = dict(os.environ, DISPLAY=display, SPECDECK_HOME=home, SPECDECK_MODELS_DIR=str(target.parent),
                       PYTHONPATH=str(ROOT),
                       QT_QPA_PLATFORM="xcb", PYTHONUNBUFFERED="1")
            env["SPECDECK_AUTOPILOT"] = json.dumps({
                "target": str(target), "ngram": 3, "prompts": [args.prompt], "max_tokens": args.max_tokens,
                "n_ctx": args.n_ctx, "load": not args.fresh, "highlight": args.highlight, "serve": args.serve,
                "after": args.after, "screenshot": str(shot), "window_size": [width, height],
            })
            done = subprocess.run([sys.executable, "-c", "import sys; from ui.launch import main; sys.exit(main([]))"],
                                  cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
            print("\n".join(line for line in done.stdout.splitlines() if "streamed" not in line))
            if not shot.exists():
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, args.out)
            print(f"saved {args.out}")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
