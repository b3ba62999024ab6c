"""Which llama.cpp this build is, which backend it was compiled with and which devices it sees, asked of
llama.cpp itself. The one answer to "which backend": doctor, the About box and the engine's ``Loaded``
event all come here.

``probe_backend`` loads llama.cpp in the calling process (the engine worker, the probe child);
``probe_backend_isolated`` asks a child, for processes that must never load it (the window, doctor).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.ceiling.backend_modules import left_out_modules, linked_library, load_backend_modules, loaded_modules
from app.ceiling.child import ProbeFailed, run_probe
from app.ceiling.gpu_fallback import why_no_gpu
from app.ceiling.gpus import as_text
from app.events import BackendDevice as BackendDevice  # re-exported: the ceiling's callers name it here

_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
_BACKEND_NAMES = {"cuda": "cuda", "vulkan": "vulkan", "metal": "metal", "mtl": "metal", "rocm": "rocm",
                  "hip": "rocm", "sycl": "sycl", "opencl": "opencl", "musa": "musa", "cann": "cann",
                  "kompute": "kompute", "webgpu": "webgpu", "zdnn": "zdnn"}


@dataclass(frozen=True)
class BackendInfo:
    """Which llama.cpp this is and what it can run on (also the About box's build info)."""

    available: bool
    llama_cpp_python: str = ""
    llama_cpp: str = ""  # llama_version(), e.g. "0.5.0-dev"
    ggml_version: str = ""
    ggml_commit: str = ""
    backend: str = "cpu"  # "cpu", "cuda", "vulkan", "metal", "rocm", "sycl", ...
    gpu_offload: bool = False
    system_info: str = ""
    cpu_features: tuple[str, ...] = ()
    devices: tuple[BackendDevice, ...] = ()
    error: str | None = None
    # A build with loadable backends (GGML_BACKEND_DL): the modules loaded, e.g. libggml-cpu-haswell.so, and
    # those left out (the AMX CPU variants, app.ceiling.backend_modules).
    modules: tuple[str, ...] = ()
    left_out_modules: tuple[str, ...] = ()
    # Why a build with a GPU backend uses no GPU, in one line (app.ceiling.gpu_fallback); None otherwise.
    gpu_fallback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendInfo:
        devices = tuple(BackendDevice(**d) for d in data.get("devices", ()))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "devices"}
        known["cpu_features"] = tuple(known.get("cpu_features", ()))
        known["modules"] = tuple(known.get("modules", ()))
        known["left_out_modules"] = tuple(known.get("left_out_modules", ()))
        return cls(**known, devices=devices)

    @property
    def gpu_devices(self) -> tuple[BackendDevice, ...]:
        return tuple(d for d in self.devices if d.type in ("gpu", "igpu"))


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """llama_print_system_info() as {section: {flag: value}}: "CPU : AVX2 = 1 | ..." ."""
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9_ ]+?)\s*:\s*(.*)$", part)
        if m and "=" in m.group(2):
            current = m.group(1).strip()
            part = m.group(2)
        name, eq, value = part.partition("=")
        if eq:
            sections.setdefault(current, {})[name.strip()] = value.strip()
    return sections


def cpu_features_from_system_info(text: str) -> tuple[str, ...]:
    cpu = parse_system_info(text).get("CPU", {})
    return tuple(k for k, v in cpu.items() if v not in ("0", ""))


def _ggml_libs(lib_dir: Path) -> list[ctypes.CDLL]:
    """libggml and libggml-base as libllama loaded them (never a second copy: see ``linked_library``)."""
    libs: list[ctypes.CDLL] = []
    for base in ("ggml", "ggml-base"):
        path = linked_library(lib_dir, base)
        if path is not None:
            try:
                libs.append(ctypes.CDLL(str(path)))
            except OSError:
                continue
    return libs


def _fn(libs: Sequence[ctypes.CDLL], name: str, restype: Any, argtypes: list[Any]) -> Any:
    for lib in libs:
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = restype
            f.argtypes = argtypes
            return f
    raise AttributeError(name)


def ggml_devices(lib_dir: Path, rpc_servers: Collection[str] | None = None) -> tuple[BackendDevice, ...]:
    """ggml's device list, bound with ctypes (llama-cpp-python does not bind ggml_backend_dev_*).
    ``rpc_servers``: list only these RPC servers' devices (None: all); the others are not asked for their
    memory, which opens a connection to them, and ggml aborts when a server has gone."""
    libs = _ggml_libs(lib_dir)
    vp = ctypes.c_void_p
    count = _fn(libs, "ggml_backend_dev_count", ctypes.c_size_t, [])
    get = _fn(libs, "ggml_backend_dev_get", vp, [ctypes.c_size_t])
    dev_name = _fn(libs, "ggml_backend_dev_name", ctypes.c_char_p, [vp])
    dev_desc = _fn(libs, "ggml_backend_dev_description", ctypes.c_char_p, [vp])
    dev_type = _fn(libs, "ggml_backend_dev_type", ctypes.c_int, [vp])
    dev_mem = _fn(libs, "ggml_backend_dev_memory", None,
                  [vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)])
    try:
        dev_reg = _fn(libs, "ggml_backend_dev_backend_reg", vp, [vp])
        reg_name = _fn(libs, "ggml_backend_reg_name", ctypes.c_char_p, [vp])
    except AttributeError:
        dev_reg = reg_name = None
    if count() == 0:
        with contextlib.suppress(AttributeError):  # builds with backends as loadable modules
            _fn(libs, "ggml_backend_load_all", None, [])()
    out: list[BackendDevice] = []
    for i in range(int(count())):
        dev = get(i)
        if not dev:
            continue
        reg = as_text(reg_name(dev_reg(dev)) or b"") if dev_reg and reg_name else ""
        description = as_text(dev_desc(dev) or b"")
        if reg == "RPC" and rpc_servers is not None and description not in rpc_servers:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        dev_mem(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(BackendDevice(
            name=as_text(dev_name(dev) or b""), description=description,
            type=_DEVICE_TYPES.get(int(dev_type(dev)), "unknown"), backend=reg,
            memory_free=int(free.value) or None, memory_total=int(total.value) or None,
        ))
    return tuple(out)


def registered_backends(lib_dir: Path) -> tuple[str, ...]:
    """The names in ggml's backend registry ("CPU", "Vulkan", "CUDA"), after the modules were loaded."""
    libs = _ggml_libs(lib_dir)
    count = _fn(libs, "ggml_backend_reg_count", ctypes.c_size_t, [])
    get = _fn(libs, "ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t])
    name = _fn(libs, "ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p])
    return tuple(as_text(name(get(i)) or b"") for i in range(int(count())))


def _backend_name(devices: Sequence[BackendDevice], sections: Iterable[str], offload: bool) -> str:
    for dev in devices:
        if dev.type in ("gpu", "igpu") and dev.backend != "RPC":  # an RPC server's backend is its own
            return _BACKEND_NAMES.get((dev.backend or dev.name).rstrip("0123456789").lower(),
                                      (dev.backend or "gpu").lower())
    if devices:
        return "cpu"  # a GPU backend without a device (no driver, no GPU) runs nothing: the CPU does
    for section in sections:
        name = _BACKEND_NAMES.get(section.lower())
        if name:
            return name
    return "gpu" if offload else "cpu"


def probe_backend(rpc_servers: Collection[str] | None = None) -> BackendInfo:
    """The llama.cpp build in this process. Loads llama.cpp: call it from doctor or the engine worker,
    or use :func:`probe_backend_isolated` from the GUI process. ``rpc_servers``: as for ``ggml_devices``."""
    try:
        import llama_cpp
    except Exception as exc:  # missing, or a shared library that fails to load
        return BackendInfo(available=False, error=f"llama-cpp-python could not be loaded: {exc}")
    errors: list[str] = []
    modular = load_backend_modules()  # before anything asks llama.cpp: a module build loads nothing by itself
    system_info = as_text(llama_cpp.llama_print_system_info() or b"")
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    llama_version = ""
    if hasattr(llama_cpp, "llama_version"):
        llama_version = as_text(llama_cpp.llama_version() or b"")
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    ggml_version = ggml_commit = ""
    try:
        libs = _ggml_libs(lib_dir)
        ggml_version = as_text(_fn(libs, "ggml_version", ctypes.c_char_p, [])() or b"")
        ggml_commit = as_text(_fn(libs, "ggml_commit", ctypes.c_char_p, [])() or b"")
    except (AttributeError, OSError):
        pass  # older ggml has no version functions
    devices: tuple[BackendDevice, ...] = ()
    try:
        devices = ggml_devices(lib_dir, rpc_servers)
    except (AttributeError, OSError) as exc:
        errors.append(f"could not list llama.cpp's devices: {exc}")
    sections = parse_system_info(system_info)
    mapped = loaded_modules()
    fallback = None
    if not any(d.type in ("gpu", "igpu") for d in devices):
        try:
            registered = registered_backends(lib_dir)
        except (AttributeError, OSError):
            registered = ()
        fallback = why_no_gpu(lib_dir, registered, mapped)
    return BackendInfo(
        available=True,
        llama_cpp_python=str(getattr(llama_cpp, "__version__", "")),
        llama_cpp=llama_version,
        ggml_version=ggml_version,
        ggml_commit=ggml_commit,
        backend=_backend_name(devices, sections, offload),
        gpu_offload=offload,
        system_info=system_info.strip(),
        cpu_features=cpu_features_from_system_info(system_info),
        devices=devices,
        error="; ".join(errors) or None,
        modules=mapped if modular else (),
        left_out_modules=left_out_modules(),
        gpu_fallback=fallback,
    )



@functools.cache
def backend_name() -> str:
    """This process's llama.cpp backend ("cpu", "cuda", "vulkan", ...), probed once (RPC servers are not asked:
    their devices are another machine's backend)."""
    return probe_backend(rpc_servers=()).backend


def probe_backend_isolated(timeout_s: float = 120.0, rpc_servers: Sequence[str] = ()) -> BackendInfo:
    """:func:`probe_backend` in a child process, so a build that traps cannot take this process down.
    ``rpc_servers``: registered in the child first, so their devices are listed with the local ones."""
    rpc = ("--rpc", ",".join(rpc_servers)) if rpc_servers else ()
    try:
        info = BackendInfo.from_dict(run_probe("backend", *rpc, timeout_s=timeout_s, what="loading llama.cpp"))
    except ProbeFailed as exc:
        logging.getLogger(__name__).warning("llama.cpp probe: %s", exc)
        return BackendInfo(available=False, error=str(exc))
    except (TypeError, ValueError) as exc:
        return BackendInfo(available=False, error=f"the llama.cpp probe gave no readable answer ({exc})")
    if info.gpu_fallback:
        logging.getLogger(__name__).warning("no GPU: %s", info.gpu_fallback)
    return info
