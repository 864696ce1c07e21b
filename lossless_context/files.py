"""Files written whole or not at all: the one atomic-write helper of the package.

Every file lcm writes for the user — the HTML view, an export, Hermes' `config.yaml`, a
store's backup — is written to a temporary file beside its destination (same directory, so
the rename is atomic), given its mode, and renamed over the destination only when complete;
on any failure the temporary file is removed and the destination is untouched. The temporary
file is private (0600) from its creation: what it holds is the user's conversation.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

PRIVATE = 0o600


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], *, mode: int = PRIVATE, prefix: str = ".lcm-",
                suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `dest` (an empty file, 0600) for the block to fill; when the
    block ends it gets `mode` and replaces `dest`; when the block raises it is removed."""
    target = Path(dest).expanduser()
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=str(target.parent.resolve()))
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_text(dest: str | os.PathLike[str], *, mode: int = PRIVATE, prefix: str = ".lcm-",
                suffix: str = ".tmp", newline: str | None = None) -> Iterator[IO[str]]:
    """A UTF-8 text stream whose content replaces `dest` when the block ends (see atomic_path)."""
    with atomic_path(dest, mode=mode, prefix=prefix, suffix=suffix) as tmp:
        with open(tmp, "w", encoding="utf-8", newline=newline) as fh:
            yield fh


def write_text_atomic(dest: str | os.PathLike[str], text: str, *, mode: int = PRIVATE,
                      prefix: str = ".lcm-", suffix: str = ".tmp") -> None:
    """`text` as the whole content of `dest`, or `dest` untouched (see atomic_path)."""
    with atomic_text(dest, mode=mode, prefix=prefix, suffix=suffix) as fh:
        fh.write(text)
