"""A GGUF file's header read from the Hub with HTTP Range requests (the first MiB, growing while the header
goes on, up to a bound) and parsed by the library's bounded reader against the file's real size."""

from __future__ import annotations

import io
from pathlib import Path

import httpx

from app.hub.client import HubError, Resolved, resolve
from app.library.gguf_format import GGUFError, Reader, TruncatedError, _parse
from app.library.gguf_reader import GGUFInfo, _interpret

FIRST_READ = 1 << 20
MAX_HEADER = 64 << 20  # vocabularies of 256k tokens with merges and a chat template stay well under this
TIMEOUT = httpx.Timeout(30.0, connect=10.0)


class _Prefix(io.RawIOBase):
    """The first bytes of a remote file, read as the file: a read past them comes back short, so the reader
    raises TruncatedError and the caller fetches more."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset
        return self.pos

    def read(self, n: int = -1) -> bytes:
        chunk = self.data[self.pos :] if n < 0 else self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk


def _fetch(client: httpx.Client, where: Resolved, length: int) -> bytes:
    headers = {"Range": f"bytes=0-{length - 1}", "Accept-Encoding": "identity", **where.headers}
    with client.stream("GET", where.url, headers=headers) as r:
        if r.status_code not in (200, 206):
            raise HubError(f"The Hub's file server answered {r.status_code} to a header read; try again later.")
        out = bytearray()
        for chunk in r.iter_bytes():
            out += chunk
            if len(out) >= length:  # a server that ignores Range: stop at what was asked
                break
        return bytes(out[:length])


def read_remote_info(repo: str, path: str, size: int, revision: str = "main") -> GGUFInfo:
    """The header of ``path`` (``size`` bytes on the Hub) as read_gguf_info describes a local file. Raises a
    GGUFError for a file that is not a usable GGUF, a HubError when the Hub does not answer."""
    name = Path(path).name
    where = Path("hf:") / repo / path  # never a local file: tensor_split then spreads weights evenly
    length = min(FIRST_READ, size)
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True) as client:
        where_now = resolve(repo, path, revision)
        retried = False
        while True:
            try:
                data = _fetch(client, where_now, length)
            except httpx.TransportError as exc:
                if retried:
                    raise HubError(f"The connection to the Hub failed while reading {name}'s header "
                                   f"({exc.__class__.__name__}).") from None
                retried = True  # once, with a fresh URL
                where_now = resolve(repo, path, revision)
                continue
            try:
                header = _parse(Reader(_Prefix(data), size, name), collect_tokens=False)  # type: ignore[arg-type]
                return _interpret(header, where, size, follow_shards=False)
            except TruncatedError as exc:
                if len(data) < length or length >= size:  # the whole file, or all the server has: it is short
                    exc.path = f"{repo}/{path}"
                    raise
                if length >= MAX_HEADER:
                    raise HubError(f"{name}'s header is longer than {MAX_HEADER >> 20} MiB, so it is not read "
                                   "from the Hub.") from None
                length = min(length * 4, size, MAX_HEADER)
            except GGUFError as exc:
                exc.path = f"{repo}/{path}"
                raise
