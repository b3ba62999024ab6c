"""llama.cpp builds whose backends are loadable modules (``GGML_BACKEND_DL``), as distributable builds are made:
one CPU library per instruction-set level (``libggml-cpu-haswell.so``, ``-skylakex``, ``-zen4``, ...), of
which ggml loads the best this CPU can run, and GPU backends beside them that load only where their driver is.

ggml looks for the modules beside the executable and in the current folder; SpecDeck's lie in llama_cpp's own
``lib`` folder (in a venv, and in the bundle's ``_internal/llama_cpp/lib``), so they are loaded from there
before llama.cpp is first used. A build with its backends linked in registers them by itself and is left
alone. Standard library only: this runs in the probe child and the engine worker.

ggml picks the CPU variant by the instruction sets CPUID lists, and on a CPU that lists AMX it picks the AMX
variant (sapphirerapids), whose matrix kernels were seen to die with SIGILL at their first tile instruction on
an Intel Xeon virtual machine that lists AMX and whose kernel grants it. SpecDeck's own builds never turn AMX on
for the same reason, so the AMX variants are left out here too and the best of the others is loaded
(``left_out_modules`` names them; the cost on a machine where AMX works is AMX's faster prompt processing).
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

# ggml-cpu-haswell, ggml-vulkan, ggml-cuda; not ggml-base or ggml itself.
_MODULE = re.compile(r"(?:lib)?ggml-(?!base\b)([a-z0-9]+)(?:-([a-z0-9_]+))?\.(?:so(?:\.[0-9.]+)?|dll|dylib)$")


def linked_library(lib_dir: Path, base: str) -> Path | None:
    """The file of ``lib<base>`` that libllama links, by its SONAME (``libggml.so.0``), else the plain name.

    A wheel holds copies, not links (libggml.so, libggml.so.0, libggml.so.0.25.3): opening another copy than
    libllama's loads a second libggml into the process, with a backend registry of its own, so the backends
    loaded or the devices asked through it would not be llama.cpp's.
    """
    plain = re.escape(base)
    sonames = sorted(p for p in lib_dir.glob(f"lib{base}.*")
                     if re.fullmatch(rf"lib{plain}\.so\.\d+|lib{plain}\.\d+\.dylib", p.name))
    if sonames:
        return sonames[0]
    return next((lib_dir / name for name in (f"lib{base}.so", f"lib{base}.dylib", f"{base}.dll")
                 if (lib_dir / name).exists()), None)


def llama_lib_dir() -> Path:
    """llama_cpp's folder of shared libraries (imports llama_cpp, which loads llama.cpp)."""
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


_modular: bool | None = None  # decided at the first call, before anything is loaded
_left_out: tuple[str, ...] = ()  # module files left out (the AMX CPU variants)

# ggml's CPU variants built with AMX_TILE (ggml/src/CMakeLists.txt, ggml_add_cpu_backend_variant).
AMX_VARIANTS = frozenset({"sapphirerapids"})
# ggml's own order in ggml_backend_load_all_from_path: GPU and other backends first, the CPU last.
_LOAD_ORDER = ("blas", "zendnn", "cann", "cuda", "hip", "metal", "rpc", "sycl", "vulkan", "virtgpu", "opencl",
               "hexagon", "musa", "openvino", "cpu")


def module_files(lib_dir: Path) -> dict[str, list[Path]]:
    """The backend module files in ``lib_dir`` by backend ("cpu": every CPU variant), unversioned names only."""
    found: dict[str, list[Path]] = {}
    for path in sorted(lib_dir.iterdir()):
        m = _MODULE.match(path.name)
        if m and path.suffix in (".so", ".dll", ".dylib") and path.is_file():
            found.setdefault(m.group(1), []).append(path)
    return found


def unused_modules(lib_dir: Path) -> tuple[str, ...]:
    """Module files here that SpecDeck does not load: the AMX CPU variants (see above)."""
    return tuple(p.name for p in module_files(lib_dir).get("cpu", ())
                 if (m := _MODULE.match(p.name)) is not None and m.group(2) in AMX_VARIANTS)


def _load_each(ggml: ctypes.CDLL, lib_dir: Path, left_out: tuple[str, ...]) -> None:
    """ggml_backend_load_all_from_path without ``left_out``: each backend's best-scoring file, in ggml's order."""
    import _ctypes

    load = ggml.ggml_backend_load
    load.restype = ctypes.c_void_p
    load.argtypes = [ctypes.c_char_p]
    files = module_files(lib_dir)
    for name in sorted(files, key=lambda n: _LOAD_ORDER.index(n) if n in _LOAD_ORDER else -1):
        best: tuple[int, Path] | None = None
        for path in files[name]:
            if path.name in left_out:
                continue
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                continue  # its driver or runtime is missing: ggml leaves such a module out too
            score_fn = getattr(lib, "ggml_backend_score", None)
            score = 1 if score_fn is None else int(score_fn())
            _ctypes.dlclose(lib._handle)  # only the chosen one stays loaded, as in ggml's own choice
            if score > 0 and (best is None or score > best[0]):
                best = (score, path)
        if best is not None:
            load(str(best[1]).encode())


def left_out_modules() -> tuple[str, ...]:
    """The module files this process left out (the AMX CPU variants)."""
    return _left_out


def load_backend_modules(lib_dir: Path | None = None) -> bool:
    """Load a module build's backends from ``lib_dir`` (llama_cpp's own) unless some are registered already.

    Returns whether this is a module build: one with no backend linked in. Safe to call any number of times.
    """
    global _modular, _left_out
    lib_dir = lib_dir or llama_lib_dir()
    path = linked_library(lib_dir, "ggml")
    if path is None:
        return False
    ggml = ctypes.CDLL(str(path))
    count = ggml.ggml_backend_reg_count
    count.restype = ctypes.c_size_t
    count.argtypes = []
    if _modular is None:
        _modular = count() == 0
    if count() == 0 and hasattr(ggml, "ggml_backend_load_all_from_path"):
        _left_out = unused_modules(lib_dir)
        if _left_out:
            _load_each(ggml, lib_dir, _left_out)
        else:
            load = ggml.ggml_backend_load_all_from_path
            load.restype = None
            load.argtypes = [ctypes.c_char_p]
            load(str(lib_dir).encode())
    return _modular


def loaded_modules(maps: str | None = None) -> tuple[str, ...]:
    """File names of the ggml backend libraries mapped into this process, e.g. ('libggml-cpu-haswell.so',
    'libggml-vulkan.so'); empty off Linux. ``maps``: the text of /proc/self/maps (read when None)."""
    if maps is None:
        if not sys.platform.startswith("linux"):
            return ()
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return ()
    names: list[str] = []
    for line in maps.splitlines():
        name = line.rsplit("/", 1)[-1] if "/" in line else ""
        if _MODULE.match(name) and name not in names:
            names.append(name)
    return tuple(names)


def cpu_variant(modules: tuple[str, ...]) -> str | None:
    """The CPU variant among ``modules`` ('haswell' for libggml-cpu-haswell.so), or None."""
    for name in modules:
        m = _MODULE.match(name)
        if m and m.group(1) == "cpu" and m.group(2):
            return m.group(2)
    return None


def describe_modules(modules: tuple[str, ...], left_out: tuple[str, ...] = ()) -> str | None:
    """One line for doctor and the About box: the CPU variant and the backend modules loaded, and those left out;
    None for a build with linked-in backends."""
    if not modules:
        return None
    variant = cpu_variant(modules)
    line = f"CPU variant {variant or 'generic'}; backend modules loaded: {', '.join(modules)}"
    if left_out:
        line += f"; AMX variant left out: {', '.join(left_out)}"
    return line
