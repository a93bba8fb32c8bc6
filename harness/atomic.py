"""Writing a file whole or not at all."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomically(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a temporary file beside it, synced
    and then renamed over it: a reader (or a crash) sees the old file or the
    new one, never part of it. The rename itself is made durable by syncing
    the folder, which is the caller's to do (several files may share one)."""
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    try:
        with partial.open("xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
