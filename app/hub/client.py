"""The Hub's API through huggingface_hub: search, a repository's file listing, a file's download URL and sha256.
Every failure becomes a HubError with one sentence; HF_ENDPOINT and HF_TOKEN are read at each call."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

import httpx
import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, get_token, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile

from app.errors import AppError
from app.hub.files import RemoteFile

DEFAULT_ENDPOINT = "https://huggingface.co"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
CONNECT_TIMEOUT = 10.0


class HubError(AppError):
    """The Hub could not be reached or refused a request; the message says what to do."""


@dataclass(frozen=True)
class RepoHit:
    repo: str
    downloads: int
    likes: int
    last_modified: datetime | None
    gated: bool


@dataclass(frozen=True)
class Resolved:
    """Where a file's bytes are now (a signed URL that expires) and what they must hash to."""

    url: str
    size: int | None
    sha256: str | None
    etag: str | None

    @property
    def headers(self) -> dict[str, str]:
        """The token goes only to the Hub itself (a file kept in git is served there), never to a CDN."""
        tok = token()
        same = urlsplit(self.url)[:2] == urlsplit(endpoint())[:2]
        return {"Authorization": f"Bearer {tok}"} if tok and same else {}


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token() -> str | None:
    """HF_TOKEN, else the token `hf auth login` saved."""
    return os.environ.get("HF_TOKEN") or get_token() or None


def repo_id(text: str) -> str | None:
    """`owner/name` from an id or a Hub URL (https://huggingface.co/owner/name/...), else None."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        parts = [p for p in urlsplit(text).path.split("/") if p]
        text = "/".join(parts[:2]) if len(parts) >= 2 else ""
    if not _REPO_ID.match(text) or any(set(p) == {"."} for p in text.split("/")):
        return None
    return text


def _reachable(url: str) -> None:
    """One TCP connect first: huggingface_hub retries a refused connection for about 20 s before it fails."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise HubError("HF_HUB_OFFLINE is set, so the Hub is not asked: unset it to search or pull.")
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise HubError(f"The Hub at {url} cannot be reached ({exc.strerror or exc}): check the network "
                       "connection, a proxy, or HF_ENDPOINT for a mirror.") from None


def gated_message(repo: str, with_token: bool) -> str:
    if with_token:
        return (f"{repo} is a gated repository and the token given has no access to it: accept its licence at "
                f"{endpoint()}/{repo}, then pull again.")
    return (f"{repo} is a gated repository: accept its licence at {endpoint()}/{repo} and give a token with "
            "HF_TOKEN=hf_... (or `hf auth login`), then pull again.")


@contextmanager
def hub_errors(repo: str | None = None, what: str = "") -> Iterator[None]:
    """huggingface_hub's and the network's failures as one HubError sentence each."""
    name = repo or "the repository"
    try:
        yield
    except GatedRepoError:
        raise HubError(gated_message(name, token() is not None)) from None
    except RevisionNotFoundError:
        raise HubError(f"{name} has no such revision.") from None
    except RemoteEntryNotFoundError:
        raise HubError(f"{name} has no file {what}." if what else f"{name} has no such file.") from None
    except RepositoryNotFoundError:
        raise HubError(f"There is no repository {name} on the Hub (or it is private: give a token with "
                       "HF_TOKEN).") from None
    except OfflineModeIsEnabled:
        raise HubError("HF_HUB_OFFLINE is set, so the Hub is not asked: unset it to search or pull.") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 429:
            raise HubError("The Hub is limiting requests (429): wait a few minutes, or give a token with HF_TOKEN, "
                           "which raises the limit.") from None
        raise HubError(f"The Hub answered {status or 'with an error'} for {name}: try again later.") from None
    except (httpx2.TransportError, httpx.TransportError) as exc:
        raise HubError(f"The connection to the Hub failed ({exc.__class__.__name__}): check the network "
                       "connection and try again.") from None


def _api() -> HfApi:
    return HfApi(endpoint=endpoint(), token=token() or False)


def search(query: str, limit: int = 20) -> list[RepoHit]:
    """GGUF repositories matching ``query``, most downloaded first."""
    _reachable(endpoint())
    with hub_errors():
        models = _api().list_models(search=query, filter="gguf", sort="downloads", limit=limit,
                                    expand=["downloads", "likes", "lastModified", "gated"])
        return [RepoHit(m.id, m.downloads or 0, m.likes or 0, m.last_modified, bool(m.gated)) for m in models]


def list_files(repo: str, revision: str = "main") -> list[RemoteFile]:
    """Every file of a repository, sub-folders included, with its size and LFS sha256."""
    _reachable(endpoint())
    with hub_errors(repo):
        out = []
        for entry in _api().list_repo_tree(repo, recursive=True, revision=revision):
            if isinstance(entry, RepoFile):
                sha = entry.lfs.sha256 if entry.lfs is not None else None
                out.append(RemoteFile(entry.path, int(entry.lfs.size if entry.lfs else entry.size), sha))
        return out


def resolve(repo: str, path: str, revision: str = "main") -> Resolved:
    """A fresh download URL for one file (the Hub's 302 target) with its size and sha256 (X-Linked-Etag)."""
    url = hf_hub_url(repo, path, revision=revision, endpoint=endpoint())
    with hub_errors(repo, path):
        meta = get_hf_file_metadata(url, token=token() or False, endpoint=endpoint())
    etag = meta.etag
    sha = etag.lower() if etag and _SHA256.match(etag.lower()) else None
    return Resolved(meta.location, meta.size, sha, etag)
