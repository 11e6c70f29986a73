"""Files written atomically: a temporary file beside the target, fsynced, renamed over it.

Torch-free; used wherever attnkit writes a file a reader may open at any time (pictures, pages,
the stored tuning), so a crash never leaves a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["write_atomic"]


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file atomically: ``write(f)`` fills a temporary file beside ``path``, which is
    flushed, fsynced and renamed over ``path``; on any error the temporary file is removed and
    an existing ``path`` is left untouched."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename durable; not every file system lets a directory be opened
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
