"""A secret of this user on this machine, kept outside every cache, that lets a cache tell
the entries this machine wrote from entries planted there.

A digest stored beside an entry proves nothing: whoever can plant the entry can plant its
digest. The emulator's shared objects run code when they are loaded, so each is recorded
with an HMAC-SHA256 under this key of what it was built from (the rebuild key: source,
compiler, flags, header) and of its bytes; an object whose HMAC does not verify (planted, a
cache restored from another machine or copied from another user) is never loaded, only
built again. The key is `$XDG_STATE_HOME/topkgen/cache-key` (default
`~/.local/state/topkgen/cache-key`), mode 0600, made on first use; where it cannot be made
(a read-only home), a key of this process alone, so entries serve only the process that
built them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from functools import lru_cache
from pathlib import Path

from topkgen.common.files import read_regular

KEY_BYTES = 32


def key_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "topkgen" / "cache-key"


@lru_cache(maxsize=1)
def key() -> bytes:
    path = key_path()
    for _ in range(2):
        try:
            data = read_regular(path, KEY_BYTES)
            if len(data) == KEY_BYTES:
                return data
            return os.urandom(KEY_BYTES)  # a damaged key file: trust nothing, and leave it for the user
        except FileNotFoundError:
            pass
        except OSError:  # a symlink, a FIFO, unreadable: a key of this process
            return os.urandom(KEY_BYTES)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, os.urandom(KEY_BYTES))
                os.fsync(fd)
                os.link(tmp, path)  # create-if-absent: two first uses agree on the first one's key
            except FileExistsError:
                pass
            finally:
                os.close(fd)
                tmp.unlink(missing_ok=True)
        except OSError:
            return os.urandom(KEY_BYTES)
    return os.urandom(KEY_BYTES)


def tag(*parts: bytes) -> str:
    """The HMAC-SHA256, hex, of `parts` (each length-prefixed, so no two lists share a tag)."""
    mac = hmac.new(key(), digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


def verify(expected: str, *parts: bytes) -> bool:
    return hmac.compare_digest(expected, tag(*parts))
