"""Reading and writing the user's files with one-line errors instead of tracebacks."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import SpecError


def read_lines(path: str | Path, what: str = "a JSONL file with one request per line",
               keep_undecodable: bool = False) -> list[str]:
    """The lines of a UTF-8 text file (split at newlines only: JSON text may hold U+2028 and the like), or a
    SpecError saying why they cannot be read. `keep_undecodable`: bytes that are not UTF-8 become lone surrogates
    for the caller to report per line, instead of an error for the whole file."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path} does not exist: give {what}") from None
    except IsADirectoryError:
        raise SpecError(f"{path} is a folder: give {what}") from None
    except OSError as e:
        raise SpecError(f"cannot read {path} ({e.strerror})") from None
    try:
        text = data.decode("utf-8", errors="surrogateescape" if keep_undecodable else "strict")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line} is not UTF-8 text: give {what}") from None
    lines = text.removeprefix("\ufeff").split("\n")  # without the byte-order mark some editors write
    return lines[:-1] if lines[-1] == "" else lines


def check_writable(path: str | Path, flag: str) -> None:
    """Refuse, before any work is done, an output path that cannot be written: a folder or a special file, in a
    missing folder (or under a file), or where we may not write or no file can be made (/proc, a read-only disk)."""
    path = Path(path).expanduser()
    parent = path.resolve().parent
    if path.is_dir():
        raise SpecError(f"{flag} {path} is a folder: give a file name")
    if path.exists() and not path.is_file():
        raise SpecError(f"{flag} {path} is not a regular file (a device, pipe or socket): give a file name")
    if parent.exists() and not parent.is_dir():
        raise SpecError(f"{flag} {path}: {path.parent} is a file, not a folder; choose another path")
    if not parent.is_dir():
        raise SpecError(f"{flag} {path}: the folder {path.parent} does not exist; create it or choose another")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise SpecError(f"{flag} {path}: no permission to write there; choose another path")
    try:  # what permissions do not tell: a pseudo file system, a read-only mount
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".mlx-spec-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"{flag} {path}: no file can be made in {path.parent} ({e.strerror}); choose another "
                        "path") from None


@contextmanager
def staging(out: Path, what: str):
    """A hidden work folder beside `out`, removed whatever happens, so that a failure leaves nothing
    half-written; any failure other than a SpecError becomes one (`what` failed ...)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    except OSError as e:
        raise SpecError(f"cannot write in the folder {out.parent} for --mlx-path ({e.strerror}): choose another "
                        "--mlx-path") from None
    try:
        yield work
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(f"{what} failed ({type(e).__name__}: {e}); nothing was written") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
