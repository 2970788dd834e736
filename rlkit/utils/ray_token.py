"""The token of a Ray cluster that listens beyond loopback: one secret in a 0600 file, never printed.

Ray 2.60's token auth (read from its installed source and checked against a running head):
- `RAY_AUTH_MODE=token` turns it on, in every process of the cluster and in every client; Ray reads
  the mode once (its RayConfig), so a process that already imported Ray must refresh it.
- The token comes from `RAY_AUTH_TOKEN` (the value), else the file `RAY_AUTH_TOKEN_PATH`, else
  `~/.ray/auth_token`. gRPC (GCS, raylet, workers) and the dashboard's HTTP API (`Authorization:
  Bearer <token>`, 401 without one, 403 with a wrong one) check it.
rlkit keeps its token out of `~/.ray/auth_token`: Ray turns token auth on for every new local
cluster when that file exists, which would lock the VS Code extension out of loopback clusters.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path

from rlkit.errors import UserError

MODE_ENV = "RAY_AUTH_MODE"
PATH_ENV = "RAY_AUTH_TOKEN_PATH"  # Ray's own name for the token file; `rlkit cluster join` reads it too
VALUE_ENV = "RAY_AUTH_TOKEN"
FIX = "copy the head's token file (its path is printed by `rlkit cluster up`) and pass it with --token-file"


def token_env(path: str | Path) -> dict[str, str]:
    """What a Ray process needs in its environment to use the token in `path`."""
    return {MODE_ENV: "token", PATH_ENV: str(Path(path).expanduser().absolute())}


def with_token(env: dict[str, str], path: str | Path) -> dict[str, str]:
    """`env` set to use the file (a `RAY_AUTH_TOKEN` value would win over any file in Ray, so it goes)."""
    out = {k: v for k, v in env.items() if k != VALUE_ENV}
    out.update(token_env(path))
    return out


def fingerprint(token: str) -> str:
    """A short digest to compare tokens between nodes without showing them."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def create_or_read(path: str | Path) -> tuple[str, bool]:
    """The token in `path`, made (random, 256 bits, mode 0600) when the file is missing; (token, created)."""
    path = Path(path).expanduser()
    if path.exists():
        return read_token(path), False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
    except FileExistsError:  # made meanwhile by another `cluster up`
        return read_token(path), False
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def read_token(path: str | Path) -> str:
    """The token in `path`; UserError (one line naming the file and the fix) if missing, empty or readable by others."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise UserError(f"token file {path} does not exist; {FIX}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"token file {path} is unreadable ({getattr(exc, 'strerror', None) or exc}); {FIX}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"token file {path} is open to other users (mode {stat.S_IMODE(mode):o}); chmod 600 {path}")
    if not text or len(text.split()) != 1:
        raise UserError(f"token file {path} holds no token (one line expected); {FIX}")
    return text


def bearer_header(token: str) -> dict[str, str]:
    """The dashboard HTTP API's header (Ray's `Authorization: Bearer <token>`)."""
    return {"Authorization": f"Bearer {token}"}
