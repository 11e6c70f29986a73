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

__all__ = ["check_writable", "usual_mode", "write_atomic"]


def check_writable(name: str, directory: str | os.PathLike) -> Path:
    """``directory`` as a Path, checked before any work: files can be created in it, or, when
    it does not exist yet, in the nearest existing directory above it (which will hold it).
    PermissionError naming ``name`` and that directory otherwise (no write or search permission,
    or a read-only file system); NotADirectoryError when that path is a file."""
    d = Path(directory).absolute()
    existing = d
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"{name}: '{existing}' is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(
            f"{name}: cannot create files in the directory '{existing}' (permission denied or "
            "a read-only file system)"
        )
    return d


def usual_mode(directory: bool = False) -> int:
    """The mode ``open`` (or, for a ``directory``, ``mkdir``) gives a new file under the
    process's umask, for files made by ``tempfile`` (0600, 0700) and then renamed into place."""
    umask = os.umask(0)  # reading the umask sets it: put it back at once
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file atomically: ``write(f)`` fills a temporary file beside ``path``, which is
    flushed, fsynced and renamed over ``path``; on any error the temporary file is removed and
    an existing ``path`` is left untouched. An OSError from creating the temporary file names
    ``path`` (with the system's reason and errno), never the temporary file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:  # name the file asked for, not the temporary one
        err = type(e)(f"{path}: cannot write the file ({e.strerror or e})")
        err.errno = e.errno
        raise err from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, usual_mode())  # mkstemp makes 0600
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
