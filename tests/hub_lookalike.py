"""A Hugging Face Hub look-alike on loopback for the hub tests: the API (`/api/models` search, model info and
tree listings with sizes and LFS sha256), `/{repo}/resolve/{rev}/{file}` answering 302 to a signed URL on a
second server (the CDN: another origin, as on the real Hub) with X-Linked-Etag / X-Linked-Size, and the CDN
serving the bytes with Range and If-Range. Gated repositories answer 401/403 with X-Error-Code: GatedRepo.

Faults for the tests: a connection closed after N bytes, a throttle (bytes per chunk, a sleep between
chunks), a pause after N bytes until released, corrupted bytes, signed URLs expired. Every CDN request is
recorded with its Range header."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Fault:
    cut_after: int | None = None  # close the connection after this many body bytes
    cuts: int = 1  # how many responses are cut
    chunk: int = 64 << 10  # bytes per write
    sleep: float = 0.0  # seconds between writes (the throttle)
    hold_after: int | None = None  # stop after this many body bytes until `release` is set
    release: threading.Event = field(default_factory=threading.Event)
    corrupt: bool = False  # flip one byte in the middle of what is served
    deny: int = 0  # answer this many requests 403 with an XML body, as an expired CDN URL does...
    deny_after: int = 0  # ...once this many responses were served
    served: int = 0
    sent: int = 0  # body bytes written so far, over all responses


@dataclass
class HubFile:
    data: bytes | None  # None: a file whose bytes are never served (its size alone is listed)
    size: int
    sha256: str
    in_git: bool = False  # a small file kept in git, not LFS: no lfs entry, served by the Hub itself


@dataclass
class Repo:
    files: dict[str, HubFile] = field(default_factory=dict)
    gated: bool = False
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-09-01T12:00:00.000Z"
    tags: tuple[str, ...] = ("gguf",)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


class HubLookalike:
    """Two HTTP servers on 127.0.0.1: ``url`` (the Hub, for HF_ENDPOINT) and the CDN it redirects to."""

    def __init__(self, tokens: tuple[str, ...] = ("hf_good",)) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults: dict[str, Fault] = {}  # by path in the repository
        self.tokens = set(tokens)
        self.requests: list[Request] = []
        self._signatures: dict[str, str] = {}  # signature -> sha256 it may fetch
        self._sig = count(1)
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()  # open keep-alive connections, closed with the servers
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(cdn=False))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(cdn=True))
        for server in (self.hub, self.cdn):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def close(self) -> None:
        for fault in self.faults.values():
            fault.release.set()
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # a client's pooled connection would keep its handler thread waiting
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    # --- content ---

    def add_file(self, repo: str, path: str, data: bytes | Path) -> HubFile:
        body = data.read_bytes() if isinstance(data, Path) else data
        f = HubFile(body, len(body), hashlib.sha256(body).hexdigest())
        self.repos.setdefault(repo, Repo()).files[path] = f
        return f

    def add_in_git(self, repo: str, path: str, data: bytes | Path) -> None:
        """A small file kept in git itself: no LFS sha256 in the listing, its bytes served by the Hub."""
        self.add_file(repo, path, data).in_git = True

    def add_listed_only(self, repo: str, path: str, size: int) -> None:
        """A file the listing shows with ``size`` bytes whose content is never needed (a free-space refusal)."""
        self.repos.setdefault(repo, Repo()).files[path] = HubFile(None, size, "0" * 64)

    def add_header_only(self, repo: str, path: str, header: bytes, size: int) -> None:
        """A file of ``size`` bytes of which only the header is served (Range requests past it get a 416)."""
        # The CDN finds bytes by sha256: each header its own, or every header-only file would serve the first's.
        sha = hashlib.sha256(header + size.to_bytes(8, "little")).hexdigest()
        self.repos.setdefault(repo, Repo()).files[path] = HubFile(header, size, sha)

    def expire_urls(self) -> None:
        """Every signed URL handed out so far stops working, as the real CDN's do after a while."""
        with self._lock:
            self._signatures.clear()

    def cdn_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith("/blob/")]

    # --- HTTP ---

    def _handler(self, cdn: bool) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with hub._lock:
                    hub._connections.add(self.connection)

            def finish(self) -> None:
                with hub._lock:
                    hub._connections.discard(self.connection)
                super().finish()

            def _record(self) -> None:
                with hub._lock:
                    hub.requests.append(Request(self.command, self.path, {k.lower(): v for k, v in
                                                                          self.headers.items()}))

            def do_HEAD(self) -> None:
                self._record()
                self._blob(head=True) if cdn else self._hub(head=True)

            def do_GET(self) -> None:
                self._record()
                self._blob(head=False) if cdn else self._hub(head=False)

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                      head: bool = False, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, obj: Any, head: bool = False, headers: dict[str, str] | None = None) -> None:
                self._send(200, json.dumps(obj).encode(), headers, head)

            def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
                self._send(status, json.dumps({"error": message}).encode(),
                           {"X-Error-Code": code, "X-Error-Message": message}, head)

            def _hub(self, head: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                query = parse_qs(url.query)
                if path == "/api/models":
                    return self._search(query)
                m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
                if m:
                    return self._tree(m.group(1), m.group(3) or "", query)
                m = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/[^/]+)?$", path)
                if m:
                    repo = hub.repos.get(m.group(1))
                    if repo is None:
                        return self._error(401, "RepoNotFound", "Repository not found")
                    return self._json(self._info(m.group(1), repo))
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
                if m:
                    return self._resolve(m.group(1), m.group(3), head)
                return self._error(404, "NotFound", "Not found", head)

            def _info(self, repo_id: str, repo: Repo) -> dict[str, Any]:
                return {"id": repo_id, "modelId": repo_id, "downloads": repo.downloads, "likes": repo.likes,
                        "lastModified": repo.last_modified, "gated": "auto" if repo.gated else False,
                        "private": False, "tags": list(repo.tags), "library_name": "gguf", "sha": COMMIT,
                        "siblings": [{"rfilename": p} for p in repo.files]}

            def _search(self, query: dict[str, list[str]]) -> None:
                words = (query.get("search") or [""])[0].lower()
                filters = query.get("filter") or []
                limit = int((query.get("limit") or ["1000"])[0])
                found = [(rid, r) for rid, r in hub.repos.items()
                         if words in rid.lower() and all(f in r.tags for f in filters)]
                found.sort(key=lambda x: -x[1].downloads)
                self._json([self._info(rid, r) for rid, r in found[:limit]])

            def _tree(self, repo_id: str, under: str, query: dict[str, list[str]]) -> None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(401, "RepoNotFound", "Repository not found")
                recursive = (query.get("recursive") or ["false"])[0].lower() == "true"
                out: list[dict[str, Any]] = []
                folders: set[str] = set()
                prefix = under.strip("/") + "/" if under else ""
                for p, f in sorted(repo.files.items()):
                    if not p.startswith(prefix):
                        continue
                    rest = p[len(prefix):]
                    if "/" in rest and not recursive:
                        folders.add(prefix + rest.split("/", 1)[0])
                        continue
                    if recursive:
                        parts = rest.split("/")[:-1]
                        folders.update(prefix + "/".join(parts[: i + 1]) for i in range(len(parts)))
                    oid = hashlib.sha1(f"blob {f.size}\0".encode() + (f.data or b"")).hexdigest()
                    entry: dict[str, Any] = {"type": "file", "oid": oid, "size": f.size, "path": p}
                    if not f.in_git:
                        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                    out.append(entry)
                out += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(folders)]
                self._json(out)

            def _resolve(self, repo_id: str, file: str, head: bool) -> None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._error(401, "RepoNotFound", "Repository not found", head)
                if repo.gated:
                    auth = self.headers.get("Authorization", "")
                    if not auth:
                        return self._error(401, "GatedRepo", "Access to this model is restricted", head)
                    if auth.removeprefix("Bearer ") not in hub.tokens:
                        return self._error(403, "GatedRepo", "Access to this model is restricted", head)
                f = repo.files.get(file)
                if f is None:
                    return self._error(404, "EntryNotFound", "Entry not found", head)
                if f.in_git:  # served here, with the git blob id as its ETag
                    body = f.data or b""
                    oid = hashlib.sha1(f"blob {f.size}\0".encode() + body).hexdigest()
                    return self._send(200, body, {"ETag": f'"{oid}"', "X-Repo-Commit": COMMIT}, head,
                                      "application/octet-stream")
                sig = f"s{next(hub._sig)}"
                with hub._lock:
                    hub._signatures[sig] = f.sha256
                location = f"{hub.cdn_url}/blob/{f.sha256}?sig={sig}&file={quote(file)}"
                self._send(302, b"", {"Location": location, "X-Linked-Etag": f'"{f.sha256}"',
                                      "X-Linked-Size": str(f.size), "X-Repo-Commit": COMMIT,
                                      "ETag": f'"{f.sha256}"'}, head, "text/plain")

            def _blob(self, head: bool) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                sha = url.path.removeprefix("/blob/")
                sig = (query.get("sig") or [""])[0]
                file = unquote((query.get("file") or [""])[0])
                with hub._lock:
                    allowed = hub._signatures.get(sig) == sha
                if not allowed:
                    body = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code><Message>Request has expired" \
                           b"</Message></Error>"
                    return self._send(403, body, head=head, ctype="application/xml")
                f = next((f for r in hub.repos.values() for f in r.files.values() if f.sha256 == sha), None)
                if f is None or f.data is None:
                    return self._send(404, b"<Error><Code>NoSuchKey</Code></Error>", head=head,
                                      ctype="application/xml")
                data = f.data
                fault = hub.faults.get(file)
                if fault is not None and fault.deny > 0 and fault.served >= fault.deny_after:
                    fault.deny -= 1
                    return self._send(403, b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>",
                                      head=head, ctype="application/xml")
                if fault is not None and fault.corrupt:
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
                start, status = 0, 200
                rng = self.headers.get("Range")
                if_range = self.headers.get("If-Range")
                if rng and (if_range is None or if_range.strip('"') == sha):
                    m = re.match(r"^bytes=(\d+)-(\d*)$", rng)
                    if m and int(m.group(1)) < len(data):
                        start = int(m.group(1))
                        end = int(m.group(2)) + 1 if m.group(2) else len(data)
                        data = data[start:end]
                        status = 206
                    elif m:
                        return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"}, head)
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{f.size}")
                self.end_headers()
                if head:
                    return
                self._stream(data, fault)

            def _stream(self, data: bytes, fault: Fault | None) -> None:
                if fault is None:
                    self.wfile.write(data)
                    return
                fault.served += 1
                cut = fault.cut_after if fault.cuts > 0 else None
                if cut is not None:
                    fault.cuts -= 1
                sent = 0
                try:
                    while sent < len(data):
                        n = fault.chunk
                        if cut is not None:
                            n = min(n, cut - sent)
                        if fault.hold_after is not None:
                            n = min(n, fault.hold_after - fault.sent)
                        if n <= 0:
                            if cut is not None and sent >= cut:
                                break
                            fault.release.wait()
                            fault.hold_after = None
                            continue
                        self.wfile.write(data[sent:sent + n])
                        self.wfile.flush()
                        sent += n
                        fault.sent += n
                        if fault.sleep:
                            time.sleep(fault.sleep)
                except OSError:
                    pass  # the client went away (killed)
                if sent < len(data):
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)

        return Handler


def write_split_model(source: Path, folder: Path, stem: str, max_tensors: int) -> list[Path]:
    """``source`` (a GGUF) rewritten as gguf-split parts `stem-0000i-of-0000n.gguf` in ``folder``."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    folder.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(folder / f"{stem}.gguf", arch, split_max_tensors=max_tensors)
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = fld.types[0]
        sub = fld.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, fld.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(folder.glob(f"{stem}-*-of-*.gguf"))


def big_model_header(folder: Path, n_embd: int = 8192, n_layer: int = 80, n_vocab: int = 128_000) -> tuple[bytes, int]:
    """(the header of a llama model of about 70B F16 parameters, the size of the whole file): its tensor table
    is real, its tensor data never written."""
    import numpy as np
    from gguf import GGUFWriter

    path = folder / "big-header.gguf"
    folder.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, "llama")
    writer.add_name("big")
    writer.add_context_length(8192)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_head_count(64)
    writer.add_head_count_kv(8)
    writer.add_feed_forward_length(28672)
    writer.add_vocab_size(n_vocab)
    f16 = np.dtype(np.float16)
    shapes = {"token_embd.weight": (n_vocab, n_embd), "output.weight": (n_vocab, n_embd)}
    for il in range(n_layer):
        shapes[f"blk.{il}.attn_q.weight"] = (n_embd, n_embd)
        shapes[f"blk.{il}.ffn_up.weight"] = (28672, n_embd)
        shapes[f"blk.{il}.ffn_down.weight"] = (n_embd, 28672)
    total = 0
    for name, shape in shapes.items():
        nbytes = shape[0] * shape[1] * 2
        writer.add_tensor_info(name, shape, f16, nbytes)
        total += -(-nbytes // 32) * 32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = path.read_bytes()
    return header, -(-len(header) // 32) * 32 + total
