"""llama.cpp's RPC backend: layers of a model on `rpc-server` processes, on this machine or others.

Three things live here. ``parse_rpc_servers`` checks the user's list ("host:port,host:port"). ``probe_server``
talks to one server in Python before llama.cpp does, with a timeout: ggml aborts the whole process when a
server refuses, does not answer or speaks another protocol version, and an rpc-server serves one client at a
time, so a server busy with another client would hang the first call into ggml. The same probe times
request/answer round trips, the network's part of every pass. ``add_rpc_servers`` then registers the servers
with ggml (``ggml_backend_rpc_add_server``), after which they are ordinary devices to llama.cpp (``RPC0``,
``RPC1``, ... of type GPU, described by their endpoint) that report their memory through the backend device API.

Standard library only at import: the window parses and probes without loading llama.cpp.
"""

from __future__ import annotations

import ctypes
import socket
import statistics
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.errors import EngineLoadError

# ggml-rpc's wire protocol (ggml/src/ggml-rpc/ggml-rpc.cpp): | cmd (1 byte) | size (u64) | data |, answered
# with | size (u64) | data |. The first command on a connection must be HELLO.
RPC_PROTO_MAJOR = 7  # the vendored ggml-rpc's RPC_PROTO_MAJOR_VERSION
RPC_PROTO_MINOR = 0
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: all zero, no RDMA
_HELLO_ANSWER = 4 + _CONN_CAPS
ROUND_TRIPS = 20  # timed at load; the median is the figure
PROBE_TIMEOUT_S = 5.0

@dataclass(frozen=True)
class ServerProbe:
    endpoint: str
    devices: int  # devices the server offers (one per backend device it was started with)
    round_trip_s: float  # median of ROUND_TRIPS request/answer round trips on one connection


def _address(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return bytes(data)


def _ask(sock: socket.socket, cmd: int, payload: bytes, answer_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != answer_size:
        raise ValueError(f"an answer of {size} bytes where {answer_size} were expected")
    return _recv_exact(sock, size)


def probe_server(endpoint: str, *, round_trips: int = ROUND_TRIPS, timeout_s: float = PROBE_TIMEOUT_S) -> ServerProbe:
    """Connect, shake hands and time ``round_trips`` device-count requests; EngineLoadError in one sentence
    when the server cannot be used (so ggml, which would abort, never meets it)."""
    try:
        with socket.create_connection(_address(endpoint), timeout=timeout_s) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = _ask(sock, _CMD_HELLO, bytes(_CONN_CAPS), _HELLO_ANSWER)
            major, minor, patch = hello[0], hello[1], hello[2]
            if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
                raise EngineLoadError(
                    f"The RPC server {endpoint} speaks protocol {major}.{minor}.{patch}; this llama.cpp speaks "
                    f"{RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: run an rpc-server from the same llama.cpp version.")
            times: list[float] = []
            count = 0
            for _ in range(max(1, round_trips)):
                t0 = time.perf_counter()
                (count,) = struct.unpack("<I", _ask(sock, _CMD_DEVICE_COUNT, b"", 4))
                times.append(time.perf_counter() - t0)
    except EngineLoadError:
        raise
    except TimeoutError:
        raise EngineLoadError(
            f"The RPC server {endpoint} did not answer within {timeout_s:g} s: it is busy with another client "
            "(an rpc-server serves one at a time) or the network drops the connection.") from None
    except ConnectionRefusedError:
        raise EngineLoadError(f"Nothing listens at {endpoint}: start rpc-server there, or correct the address.") \
            from None
    except (OSError, ValueError, struct.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise EngineLoadError(f"The RPC server {endpoint} could not be used ({reason}).") from None
    if count == 0:
        raise EngineLoadError(f"The RPC server {endpoint} offers no device.")
    return ServerProbe(endpoint, int(count), statistics.median(times))


def network_seconds_per_pass(probes: Sequence[ServerProbe]) -> float:
    """The network's time in one pass over a model split across these servers: one round trip each.

    llama.cpp sends a pass's graph to each server without waiting, but the activations leaving one server
    come back through this machine before the next server (or the sampler) can go on, so every server holding
    layers adds one synchronous round trip. The bytes themselves (a few KB of activations, the logits) are
    left out: at a round trip's scale on a LAN they are small, and the decode timing at load measures all."""
    return sum(p.round_trip_s for p in probes)


# --- registering with ggml (in the process that holds llama.cpp) -----------------------------------

_registered: list[str] = []
_lock = threading.Lock()


def registered_servers() -> tuple[str, ...]:
    return tuple(_registered)


def add_rpc_servers(servers: Sequence[str], lib_dir: Path | None = None) -> None:
    """Register ``servers`` (already probed) with ggml, each once per process; EngineLoadError when this
    llama.cpp has no RPC backend."""
    from app.ceiling.backend import _fn, _ggml_libs
    from app.ceiling.backend_modules import llama_lib_dir, load_backend_modules

    with _lock:
        todo = [s for s in servers if s not in _registered]
        if not todo:
            return
        lib_dir = lib_dir or llama_lib_dir()
        load_backend_modules(lib_dir)  # a module build finds its ggml-rpc module here
        libs = _ggml_libs(lib_dir)
        vp = ctypes.c_void_p
        reg_by_name = _fn(libs, "ggml_backend_reg_by_name", vp, [ctypes.c_char_p])
        proc_address = _fn(libs, "ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p])
        register = _fn(libs, "ggml_backend_register", None, [vp])
        rpc = reg_by_name(b"RPC")
        if not rpc:
            raise EngineLoadError(
                "This llama.cpp was built without the RPC backend: set it up with `python3 bootstrap.py --build "
                "rpc` (llama.cpp with -DGGML_RPC=ON) to use RPC servers.")
        add_server = ctypes.CFUNCTYPE(vp, ctypes.c_char_p)(proc_address(rpc, b"ggml_backend_rpc_add_server"))
        for endpoint in todo:
            reg = add_server(endpoint.encode())
            if not reg:
                raise EngineLoadError(f"The RPC server {endpoint} offers no device.")
            register(reg)
            _registered.append(endpoint)


def rpc_available(lib_dir: Path | None = None) -> bool:
    """Whether this process's llama.cpp has the RPC backend (loads llama.cpp)."""
    from app.ceiling.backend import _fn, _ggml_libs
    from app.ceiling.backend_modules import llama_lib_dir, load_backend_modules

    lib_dir = lib_dir or llama_lib_dir()
    load_backend_modules(lib_dir)
    reg_by_name = _fn(_ggml_libs(lib_dir), "ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p])
    return bool(reg_by_name(b"RPC"))


def connect_servers(servers: Sequence[str]) -> tuple[ServerProbe, ...]:
    """Probe each server (one sentence when one cannot be used), then register them all with ggml. Call it
    with no model of this process on the servers: an rpc-server serving this process's own earlier
    connection would not answer the probe."""
    probes = tuple(probe_server(s) for s in servers)
    if servers:
        add_rpc_servers(servers)
    return probes


def model_devices(servers: Sequence[str], lib_dir: Path | None = None) -> ctypes.Array[ctypes.c_void_p] | None:
    """The devices for llama_model_params.devices (NULL-terminated), in llama.cpp's own default order: the
    RPC devices of ``servers``, then the local GPUs (the integrated ones of one backend only where there is
    no discrete GPU). None while no server was ever registered here: llama.cpp's default is the same list.
    Needed because ggml cannot unregister a server, and one registered for an earlier load must not take
    layers of this one."""
    if not _registered:
        return None
    from app.ceiling.backend import _fn, _ggml_libs
    from app.ceiling.backend_modules import llama_lib_dir

    libs = _ggml_libs(lib_dir or llama_lib_dir())
    vp = ctypes.c_void_p
    count = _fn(libs, "ggml_backend_dev_count", ctypes.c_size_t, [])
    get = _fn(libs, "ggml_backend_dev_get", vp, [ctypes.c_size_t])
    dev_type = _fn(libs, "ggml_backend_dev_type", ctypes.c_int, [vp])
    dev_desc = _fn(libs, "ggml_backend_dev_description", ctypes.c_char_p, [vp])
    dev_reg = _fn(libs, "ggml_backend_dev_backend_reg", vp, [vp])
    reg_name = _fn(libs, "ggml_backend_reg_name", ctypes.c_char_p, [vp])
    rpc: dict[str, list[int]] = {}
    gpus: list[int] = []
    igpus: list[tuple[int, int]] = []  # (device, its registry)
    for i in range(int(count())):
        dev = get(i)
        kind = int(dev_type(dev))
        if kind == 1 and (reg_name(dev_reg(dev)) or b"") == b"RPC":
            rpc.setdefault((dev_desc(dev) or b"").decode(), []).append(dev)
        elif kind == 1:
            gpus.append(dev)
        elif kind == 2:
            igpus.append((dev, dev_reg(dev)))
    chosen = [d for s in servers for d in rpc.get(s, [])] + gpus
    if not gpus and igpus:
        chosen += [d for d, reg in igpus if reg == igpus[0][1]]
    return (vp * (len(chosen) + 1))(*chosen, None)


# What ggml-rpc writes before it aborts the process, when a server goes away or never answered.
_RPC_ABORTS = ("Remote RPC server crashed", "Failed to connect to", "RPC handshake failed")


def rpc_failure(log_lines: Sequence[str], during: str) -> str | None:
    """The one sentence for an engine that ggml-rpc aborted (a server ended or the network dropped it), from
    the engine's last log lines; None when that was not the cause."""
    if not any(mark in line for line in log_lines for mark in _RPC_ABORTS):
        return None
    what = {"load": "while loading", "generate": "while answering"}.get(during, "")
    return (f"An RPC server stopped answering {what} (its rpc-server ended or the network dropped the "
            "connection), so the engine stopped; your chat is safe: start the server again, or remove it from "
            "the RPC servers, and restart the engine.").replace("  ", " ")

