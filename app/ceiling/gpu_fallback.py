"""Why llama.cpp runs on the CPU although its build has a GPU backend: one line for doctor, the About box and
the log ("Vulkan: no Vulkan driver is installed ...").

ggml says nothing useful when a GPU backend finds no device: a release build drops a module that fails to
load without a word, Vulkan's backend leaves out a CPU-type device (Mesa's llvmpipe) and CUDA's logs only its
runtime's error string. So the drivers are asked directly here, through their C entry points (the Vulkan
loader's vkCreateInstance and vkEnumeratePhysicalDevices, the NVIDIA driver's cuInit and cuDeviceGetCount).
Standard library only: this runs in the probe child and the engine worker.
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# GPU backends by the name in their module's file (libggml-vulkan.so) and their registry's name (lower case),
# as a user knows them.
GPU_BACKENDS = {"cuda": "CUDA", "vulkan": "Vulkan", "hip": "ROCm", "rocm": "ROCm", "sycl": "SYCL",
                "opencl": "OpenCL", "metal": "Metal", "musa": "MUSA"}
_MODULE_FILE = re.compile(r"(?:lib)?ggml-([a-z]+)\.(?:so|dll|dylib)$")
_MAPPED_FILE = re.compile(r"(?:lib)?ggml-([a-z]+)\.(?:so(?:\.[0-9.]+)?|dll|dylib)$")  # libggml-cuda.so.0 too

VK_SUCCESS = 0
VK_INCOMPLETE = 5
VK_ERRORS = {-1: "VK_ERROR_OUT_OF_HOST_MEMORY", -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
             -3: "VK_ERROR_INITIALIZATION_FAILED", -4: "VK_ERROR_DEVICE_LOST", -6: "VK_ERROR_LAYER_NOT_PRESENT",
             -7: "VK_ERROR_EXTENSION_NOT_PRESENT", -9: "VK_ERROR_INCOMPATIBLE_DRIVER"}
VK_DEVICE_TYPES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}
VK_GPU_TYPES = {"integrated GPU", "discrete GPU", "virtual GPU"}
VULKAN_LOADERS = {"win32": ("vulkan-1.dll",), "darwin": ("libvulkan.1.dylib", "libMoltenVK.dylib")}
CUDA_DRIVERS = {"win32": ("nvcuda.dll",)}


def gpu_module_files(lib_dir: Path) -> dict[str, Path]:
    """The GPU backend modules in ``lib_dir`` (a build with ``GGML_BACKEND_DL``), by backend: {'vulkan': path}."""
    found: dict[str, Path] = {}
    try:
        entries = sorted(lib_dir.iterdir())
    except OSError:
        return found
    for path in entries:
        m = _MODULE_FILE.match(path.name)
        if m and m.group(1) in GPU_BACKENDS:
            found.setdefault(m.group(1), path)
    return found


def module_load_error(path: Path) -> str | None:
    """Why the dynamic linker refuses a module (its own message), or None when it loads. A module that loads
    is closed again, so that it does not count as loaded by llama.cpp afterwards (/proc/self/maps)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return str(exc).replace(f"{path}: ", "").strip() or "the dynamic linker refused it"
    if sys.platform != "win32":
        import _ctypes

        _ctypes.dlclose(lib._handle)
    return None


@dataclass(frozen=True)
class VulkanDevice:
    name: str
    kind: str  # "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other"


class _VkApplicationInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _VkInstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_VkApplicationInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


# VkPhysicalDeviceProperties: apiVersion, driverVersion, vendorID, deviceID, deviceType (uint32 each), then
# deviceName[256], then the limits; a buffer larger than the whole struct (824 bytes) receives it.
_VK_PROPERTIES_BYTES = 4096
_VK_DEVICE_TYPE_OFFSET = 16
_VK_DEVICE_NAME_OFFSET = 20
_VK_DEVICE_NAME_BYTES = 256


def _open_first(names: Iterable[str]) -> tuple[ctypes.CDLL | None, str]:
    error = ""
    for name in names:
        try:
            return ctypes.CDLL(name), ""
        except OSError as exc:
            error = error or str(exc)
    return None, error


def vulkan_devices() -> tuple[list[VulkanDevice], str | None]:
    """The Vulkan loader's physical devices, or ([], why none can be listed)."""
    loader, _ = _open_first(VULKAN_LOADERS.get(sys.platform, ("libvulkan.so.1",)))
    if loader is None:
        return [], "no Vulkan loader (libvulkan) is installed"
    vp = ctypes.c_void_p
    create = loader.vkCreateInstance
    create.restype, create.argtypes = ctypes.c_int, [ctypes.POINTER(_VkInstanceCreateInfo), vp, ctypes.POINTER(vp)]
    enumerate_devices = loader.vkEnumeratePhysicalDevices
    enumerate_devices.restype = ctypes.c_int
    enumerate_devices.argtypes = [vp, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(vp)]
    properties = loader.vkGetPhysicalDeviceProperties
    properties.restype, properties.argtypes = None, [vp, ctypes.POINTER(ctypes.c_char)]
    destroy = loader.vkDestroyInstance
    destroy.restype, destroy.argtypes = None, [vp, vp]

    app_info = _VkApplicationInfo(0, None, b"SpecDeck", 1, b"SpecDeck", 1, 1 << 22)  # Vulkan 1.0
    info = _VkInstanceCreateInfo(1, None, 0, ctypes.pointer(app_info), 0, None, 0, None)
    instance = vp()
    result = create(ctypes.byref(info), None, ctypes.byref(instance))
    if result != VK_SUCCESS:
        return [], f"no Vulkan driver is installed (vkCreateInstance: {VK_ERRORS.get(result, result)})"
    try:
        count = ctypes.c_uint32(0)
        result = enumerate_devices(instance, ctypes.byref(count), None)
        if result not in (VK_SUCCESS, VK_INCOMPLETE):
            code = VK_ERRORS.get(result, result)
            return [], f"the Vulkan driver lists no device (vkEnumeratePhysicalDevices: {code})"
        handles = (vp * max(count.value, 1))()
        result = enumerate_devices(instance, ctypes.byref(count), handles)
        devices: list[VulkanDevice] = []
        for handle in list(handles)[:count.value]:
            buf = ctypes.create_string_buffer(_VK_PROPERTIES_BYTES)
            properties(handle, buf)
            kind = int.from_bytes(buf.raw[_VK_DEVICE_TYPE_OFFSET:_VK_DEVICE_TYPE_OFFSET + 4], sys.byteorder)
            raw = buf.raw[_VK_DEVICE_NAME_OFFSET:_VK_DEVICE_NAME_OFFSET + _VK_DEVICE_NAME_BYTES]
            name = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace").strip() or "an unnamed device"
            devices.append(VulkanDevice(name, VK_DEVICE_TYPES.get(kind, "other")))
        return devices, None if devices else "the Vulkan driver lists no device"
    finally:
        destroy(instance, None)


def vulkan_reason(devices: list[VulkanDevice], error: str | None) -> str:
    """Why llama.cpp's Vulkan backend has no device, from what the loader lists."""
    if error:
        return error
    gpus = [d for d in devices if d.kind in VK_GPU_TYPES]
    if gpus:
        return (f"llama.cpp could not use the Vulkan device {gpus[0].name} ({gpus[0].kind}); "
                "GGML_VK_VISIBLE_DEVICES may leave it out")
    names = ", ".join(f"{d.name} ({d.kind})" for d in devices)
    return (f"the only Vulkan device, {names}, runs on the CPU; llama.cpp leaves such devices out because its "
            "CPU backend is faster")


@dataclass(frozen=True)
class CudaDriver:
    loaded: bool
    version: int = 0  # cuDriverGetVersion: 12040 for CUDA 12.4
    init_error: str | None = None  # cuInit's error name
    devices: int = 0


def cuda_driver() -> CudaDriver:
    """What the NVIDIA driver (libcuda) reports: whether it is there, its CUDA version, and its GPUs."""
    lib, _ = _open_first(CUDA_DRIVERS.get(sys.platform, ("libcuda.so.1",)))
    if lib is None:
        return CudaDriver(loaded=False)
    version = ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    result = int(lib.cuInit(0))
    if result != 0:
        name = ctypes.c_char_p()
        get_name = lib.cuGetErrorName
        get_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        text = name.value.decode() if get_name(result, ctypes.byref(name)) == 0 and name.value else str(result)
        return CudaDriver(loaded=True, version=version.value, init_error=text)
    count = ctypes.c_int(0)
    lib.cuDeviceGetCount(ctypes.byref(count))
    return CudaDriver(loaded=True, version=version.value, devices=count.value)


def cuda_runtime_major(lib_dir: Path) -> int | None:
    """The CUDA major version the build's runtime needs (libcudart.so.13 beside the modules -> 13)."""
    for path in sorted(lib_dir.glob("libcudart.so.*")) + sorted(lib_dir.glob("cudart64_*.dll")):
        m = re.match(r"(?:libcudart\.so\.|cudart64_)(\d+)", path.name)
        if m:
            return int(m.group(1)[:2]) if path.suffix == ".dll" else int(m.group(1))
    return None


def cuda_reason(driver: CudaDriver, runtime_major: int | None) -> str:
    """Why llama.cpp's CUDA backend has no device, from what the driver reports."""
    if not driver.loaded:
        return "no NVIDIA driver is installed (libcuda not found)"
    have = f"{driver.version // 1000}.{driver.version % 1000 // 10}"
    if runtime_major is not None and driver.version and driver.version // 1000 < runtime_major:
        return (f"the NVIDIA driver supports CUDA {have}, this build needs CUDA {runtime_major}: update the "
                "driver")
    if driver.init_error:
        return f"the NVIDIA driver found no usable GPU (cuInit: {driver.init_error})"
    if driver.devices == 0:
        return "the NVIDIA driver lists no GPU"
    return f"llama.cpp's CUDA backend lists none of the driver's {driver.devices} GPUs (see the engine log)"


def why_no_gpu(lib_dir: Path, registered: Iterable[str], loaded: Iterable[str]) -> str | None:
    """One line on why a build with a GPU backend uses none, or None for a build without one.

    ``registered``: ggml's backend registry names ("CPU", "Vulkan"); ``loaded``: the ggml libraries this process
    mapped (``backend_modules.loaded_modules``). Call it only when llama.cpp lists no GPU device.
    """
    modules = gpu_module_files(lib_dir)
    backends = list(modules)
    backends += [name.lower() for name in registered if name.lower() in GPU_BACKENDS and name.lower() not in backends]
    if not backends:
        return None
    mapped = {m.group(1) for m in map(_MAPPED_FILE.match, loaded) if m}
    reasons: list[str] = []
    for backend in backends:
        label = GPU_BACKENDS[backend]
        path = modules.get(backend)
        # Only a module ggml did not keep is opened here (and closed again): never a second copy of a loaded one.
        error = module_load_error(path) if path is not None and backend not in mapped else None
        if error:
            reason = f"its module does not load ({error})"
        elif backend == "vulkan":
            reason = vulkan_reason(*vulkan_devices())
        elif backend == "cuda":
            reason = cuda_reason(cuda_driver(), cuda_runtime_major(lib_dir))
        else:
            reason = "it lists no device"
        reasons.append(f"{label}: {reason}")
    return "; ".join(reasons) + "; llama.cpp runs on the CPU"
