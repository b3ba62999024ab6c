"""GPU checks of a built bundle: the any-x86-64 bundle with its Vulkan module, or the CUDA bundle.

    python packaging/bundle_check.py vulkan --bundle dist/vulkan/SpecDeck
    python packaging/bundle_check.py cuda --bundle dist/cuda/SpecDeck

Run by `packaging/gpu_check --bundle vulkan|cuda` after it has built the bundle. Each case runs the frozen app's
own `specdeck doctor` and `specdeck chat` (the engine worker) on a tiny model, and fails with a message naming it:

vulkan  no Vulkan driver (the loader finds no driver file): runs on the CPU, and doctor, its log and its JSON
        say why in one line; llvmpipe alone (Mesa's Vulkan device on the CPU) without the override: the same,
        naming llvmpipe; llvmpipe admitted with GGML_VK_VISIBLE_DEVICES=0 (a test aid, never set by SpecDeck):
        doctor lists Vulkan0 with its memory, the model's layers go to Vulkan0, and it answers.
cuda    without an NVIDIA driver (this machine): the CUDA module loads, the app runs on the CPU and says why;
        with a GPU: doctor lists CUDA0 with its memory, the layers go to CUDA0, and it answers.

Standard library only, besides writing the tiny model (the repo's tests.gguf_fixtures, with numpy and gguf:
run it with the venv the bundle was built from).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_test import StepFailed, build_info, executables, log, run

NO_DRIVER = "/nonexistent/specdeck-no-vulkan-driver.json"
LAYERS = 4


def lib_dir(bundle: Path) -> Path:
    return bundle / "_internal" / "llama_cpp" / "lib"


def check_layout(bundle: Path, kind: str) -> None:
    names = sorted(p.name for p in lib_dir(bundle).iterdir())
    wanted = ["libggml-vulkan.so"] if kind == "vulkan" else [
        "libggml-cuda.so", "libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"]
    missing = [n for n in wanted if n not in names]
    if missing or not any(n.startswith("libggml-cpu") for n in names):
        raise StepFailed(f"layout: {missing or 'no CPU module'} not in {lib_dir(bundle)}: {names}")
    driver = [p.name for p in bundle.rglob("*") if re.match(r"lib(vulkan|cuda|nvidia-ml)\.so", p.name)]
    if driver:
        raise StepFailed(f"layout: the bundle carries driver libraries, which must be the system's: {driver}")
    log(f"layout: ok ({', '.join(n for n in names if 'ggml' in n or 'cu' in n)})")


def doctor(cli: Path, env: dict[str, str], case: str) -> tuple[dict[str, Any], str]:
    """(the build info from doctor's JSON, doctor's text) in this environment: one run writes both."""
    out = Path(env["SPECDECK_HOME"]) / "doctor.json"
    text = run([str(cli), "doctor", "--json", str(out)], f"{case}: doctor", 300, env).stdout
    try:
        info = build_info(json.loads(out.read_text())) or {}
    except (OSError, json.JSONDecodeError) as exc:
        raise StepFailed(f"{case}: doctor --json wrote no JSON ({exc})") from exc
    return info, text


def expect_cpu_fallback(cli: Path, env: dict[str, str], case: str, says: str) -> dict[str, Any]:
    """No GPU device, the app on the CPU, and one line saying why (containing ``says``) in doctor's JSON, its
    text and the log."""
    info, text = doctor(cli, env, case)
    gpus = [d for d in info.get("devices") or [] if d.get("type") in ("gpu", "igpu")]
    reason = info.get("gpu_fallback") or ""
    if gpus or info.get("backend") != "cpu":
        raise StepFailed(f"{case}: expected the CPU, got backend {info.get('backend')} with {gpus}")
    if says not in reason:
        raise StepFailed(f"{case}: doctor's reason {reason!r} does not say {says!r}")
    lines = [line for line in text.splitlines() if line.startswith("no GPU ")]
    if len(lines) != 1 or says not in lines[0]:
        raise StepFailed(f"{case}: doctor's text should have one 'no GPU' line saying {says!r}:\n{text}")
    logged = "".join(p.read_text(errors="replace") for p in Path(env["SPECDECK_HOME"]).rglob("specdeck*.log"))
    if f"no GPU: {reason}" not in logged:
        raise StepFailed(f"{case}: the log does not have the line 'no GPU: {reason}'")
    log(f"{case}: ok, on the CPU: {lines[0]}")
    return info


def chat(cli: Path, model: Path, env: dict[str, str], case: str) -> tuple[str, str]:
    """(the answer, the engine worker's log) of one short chat, which must stop at its 4 tokens (the tiny
    model's random bytes may print as nothing, so the stats line's reason counts, not the text)."""
    done = run([str(cli), "chat", "--target", str(model), "--max-tokens", "4", "--ngram", "0", "--stats"],
               f"{case}: chat", 600, env, stdin="hi\n")
    answer = " ".join(line.lstrip("> ").strip() for line in done.stdout.splitlines()
                      if not line.startswith("[")).strip()
    if not re.search(r"tok/s, .*(max_tokens|eog)\]", done.stderr):
        raise StepFailed(f"{case}: chat gave no answer\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}")
    engine_log = "".join(p.read_text(errors="replace")
                         for p in sorted(Path(env["SPECDECK_HOME"]).rglob("engine-*.log")))
    return answer, engine_log


def expect_gpu(cli: Path, model: Path, env: dict[str, str], case: str, device: str) -> None:
    """``device`` (Vulkan0, CUDA0) listed with its memory, the model's layers on it, and an answer."""
    info, text = doctor(cli, env, case)
    found = next((d for d in info.get("devices") or [] if d.get("name") == device), None)
    if found is None or not found.get("memory_total"):
        raise StepFailed(f"{case}: doctor lists no {device} with its memory: {info.get('devices')}")
    line = next((line for line in text.splitlines() if line.startswith("devices ")), "")
    if f"{device} (" not in line or " free of " not in line.split(f"{device} (", 1)[1]:
        raise StepFailed(f"{case}: doctor's devices line does not show {device}'s memory: {line!r}")
    if info.get("gpu_fallback"):
        raise StepFailed(f"{case}: doctor says no GPU although {device} is there: {info['gpu_fallback']}")
    answer, engine_log = chat(cli, model, env, case)
    buffers = re.findall(rf"{device} model buffer size =\s+([0-9.]+) MiB", engine_log)
    offloaded = re.findall(r"offloaded (\d+)/(\d+) layers to GPU", engine_log)
    if not buffers or float(buffers[-1]) <= 0 or not offloaded or offloaded[-1][0] != offloaded[-1][1]:
        raise StepFailed(f"{case}: the layers did not all go to {device} (buffers {buffers}, offloaded "
                         f"{offloaded})\n{engine_log[-3000:]}")
    log(f"{case}: ok, {line.removeprefix('devices').strip()}; {offloaded[-1][0]}/{offloaded[-1][1]} layers and "
        f"{buffers[-1]} MiB of weights on {device}; answer {answer!r}")


def tiny_model(folder: Path) -> Path:
    from tests.gguf_fixtures import write_tiny_model

    return write_tiny_model(folder / "tiny-gpu-check.gguf", n_layer=LAYERS, n_embd=128, n_head=4, n_head_kv=2,
                            n_ff=256, name="tiny-gpu-check")


def has_llvmpipe() -> bool:
    return any(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json"))


def has_nvidia_driver() -> bool:
    return shutil.which("nvidia-smi") is not None and run_quietly(["nvidia-smi", "-L"])


def run_quietly(cmd: list[str]) -> bool:
    import subprocess

    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("kind", choices=("vulkan", "cuda"))
    parser.add_argument("--bundle", type=Path, required=True, help="the bundle folder (…/SpecDeck)")
    args = parser.parse_args()
    bundle = args.bundle.resolve()
    cli, _ = executables(bundle)
    started = time.monotonic()
    try:
        if not cli.exists():
            raise StepFailed(f"setup: no {cli}; build the bundle first")
        size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file() and not p.is_symlink())
        log(f"bundle: {bundle} ({size / 1e6:.0f} MB)")
        check_layout(bundle, args.kind)
        with tempfile.TemporaryDirectory(prefix="specdeck-gpu-bundle-") as tmp:
            model = tiny_model(Path(tmp))
            base = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "GGML_VK_VISIBLE_DEVICES", "VK_DRIVER_FILES", "VK_ICD_FILENAMES")}

            def case_env(name: str, **extra: str) -> dict[str, str]:
                home = Path(tmp) / name
                home.mkdir()
                return dict(base, SPECDECK_HOME=str(home), SPECDECK_MODELS_DIR=str(model.parent), **extra)

            if args.kind == "vulkan":
                no_driver = case_env("no-driver", VK_DRIVER_FILES=NO_DRIVER, VK_ICD_FILENAMES=NO_DRIVER)
                expect_cpu_fallback(cli, no_driver, "no Vulkan driver", "Vulkan: no Vulkan driver is installed")
                answer, _ = chat(cli, model, no_driver, "no Vulkan driver")
                log(f"no Vulkan driver: ok, answered on the CPU: {answer!r}")
                if not has_llvmpipe():
                    raise StepFailed("llvmpipe: Mesa's Vulkan driver is not installed (packaging/vulkan_sdk)")
                expect_cpu_fallback(cli, case_env("llvmpipe"), "llvmpipe, not admitted", "llvmpipe")
                expect_gpu(cli, model, case_env("llvmpipe-admitted", GGML_VK_VISIBLE_DEVICES="0"),
                           "llvmpipe admitted (GGML_VK_VISIBLE_DEVICES=0)", "Vulkan0")
            elif has_nvidia_driver():
                expect_gpu(cli, model, case_env("cuda"), "NVIDIA GPU", "CUDA0")
            else:
                env = case_env("no-nvidia")
                info = expect_cpu_fallback(cli, env, "no NVIDIA driver", "CUDA: no NVIDIA driver is installed")
                if "libggml-cuda.so" not in (info.get("modules") or []):
                    raise StepFailed(f"no NVIDIA driver: the CUDA module did not load: {info.get('modules')}")
                answer, _ = chat(cli, model, env, "no NVIDIA driver")
                log(f"no NVIDIA driver: ok, the CUDA module loaded, answered on the CPU: {answer!r}")
    except StepFailed as exc:
        log(f"FAILED at {exc}")
        return 1
    log(f"all {args.kind} bundle checks passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
