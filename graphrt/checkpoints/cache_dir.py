"""graphrt's conversion cache on disk: where it lives, how big it may grow, how it is written.

A GGUF file is converted once (its tokenizer into ``tokenizers`` JSON, its blocks dequantised
into safetensors) under ``$XDG_CACHE_HOME/graphrt/gguf/<key>/`` (``~/.cache`` without
``XDG_CACHE_HOME``); the key hashes the file's resolved path, size and modification time with
:data:`FORMAT`, so an edited or replaced file gets a new entry. Environment:

| variable | meaning | default |
| --- | --- | --- |
| ``GRAPHRT_CACHE`` | ``0`` turns the cache off (nothing read or written) | on |
| ``GRAPHRT_CACHE_MAX_GB`` | GiB of converted weights kept; the least recently used go first | 4 |

Every file is written under a temporary name and renamed into place, so a reader sees a whole
file or none; a file that cannot be read back, that records another source (:func:`source_id`)
or that holds impossible values is ignored and rebuilt, with one warning naming it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from graphrt.kernels import switches

log = logging.getLogger("graphrt.cache")

#: Bumped whenever what a cache entry holds changes: older entries are then never read.
FORMAT = 1
#: Suffix of the converted weight files (what the size bound counts and evicts).
WEIGHTS_SUFFIX = ".safetensors"


cache_root = switches.cache_root


def max_bytes() -> int:
    """The bound on converted weights, from ``GRAPHRT_CACHE_MAX_GB`` (GiB, >= 0)."""
    return int(float(switches.active()["GRAPHRT_CACHE_MAX_GB"]) * 2**30)


def source_id(source: Path) -> str:
    """The hash of checkpoint file ``source``'s identity (resolved path, size, modification
    time) and :data:`FORMAT`: what names its entry, and what each file of the entry records so
    that a file copied in from another entry is found out (and converted again).

    NOTE: the file's identity, not a hash of its content: hashing a multi-GB GGUF would cost
    seconds on every start, which is what the cache is there to save.
    """
    path = source.resolve()
    stat = path.stat()
    identity = f"{FORMAT}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.sha256(identity.encode()).hexdigest()


def entry_dir(source: Path) -> Path | None:
    """The cache folder of checkpoint file ``source`` (None when the cache is off)."""
    root = cache_root()
    if root is None:
        return None
    return root / "gguf" / source_id(source)[:32]


def write_atomic(dest: Path, write: Callable[[Path], None]) -> bool:
    """``write(tmp)`` a temporary file beside ``dest``, then rename it to ``dest``.

    Returns False (logged, the temporary file removed) when the disk refuses: a cache that
    cannot be written only costs the next start its conversion.
    """
    tmp: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        os.close(fd)
        tmp = Path(name)
        write(tmp)
        os.replace(tmp, dest)
        tmp = None
        return True
    except OSError as err:
        log.warning("graphrt cache: cannot write %s (%s); continuing without it", dest, err)
        return False
    finally:  # NOTE: also on an error of ``write`` itself, or Ctrl-C: no half file stays
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def make_room(need: int, keep: Path) -> bool:
    """Delete the least recently used weight files until ``need`` more bytes fit the bound.

    Returns False, deleting nothing, when ``need`` alone is over the bound. ``keep`` (the
    file about to be written) is never deleted.
    """
    limit, root = max_bytes(), cache_root()
    if root is None or need > limit:
        return False
    files = []
    for f in root.glob(f"gguf/*/*{WEIGHTS_SUFFIX}"):
        try:
            files.append((f.stat().st_mtime_ns, f.stat().st_size, f))
        except OSError:  # NOTE: deleted meanwhile by another process
            continue
    total = sum(size for _, size, _ in files) + need
    for _, size, f in sorted(files):
        if total <= limit:
            break
        if f != keep:
            f.unlink(missing_ok=True)
            total -= size
            log.info("graphrt cache: evicted %s (%.2f GiB) for room", f, size / 2**30)
    return True


def touch(path: Path) -> None:
    """Mark ``path`` as just used (its mtime orders eviction)."""
    with contextlib.suppress(OSError):
        os.utime(path)
