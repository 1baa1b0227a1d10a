"""A GGUF file's architecture, read from its header without loading it (no MLX): for Settings' list of
the models on this machine, which says whether Lanes runs each.

The header is ``GGUF``, a version (uint32), the tensor and key counts (uint64 each), then the keys:
a name (uint64 length, UTF-8), a value type (uint32) and the value. ``general.architecture`` comes
first in files llama.cpp writes; the reader steps over other values (arrays included) for at most
``MAX_KEYS`` keys.

Worked example: a file starting ``b"GGUF" 03000000 ...`` whose first key is ``general.architecture``
= ``"llama"`` gives ``"llama"``; a file that is not GGUF, or cut short, gives None.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

SUPPORTED_ARCHITECTURES = ("llama",)  # what engine.model.gguf loads onto mlx-lm's modules
MAX_KEYS = 64
_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # type -> bytes
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data


def _string(f: BinaryIO) -> bytes:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > 1 << 20:  # no key or architecture name is this long: not a header we understand
        raise ValueError
    return _read(f, n)


def _skip(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.seek(_SCALARS[kind], 1)
    elif kind == _STRING:
        (n,) = struct.unpack("<Q", _read(f, 8))
        f.seek(n, 1)
    elif kind == _ARRAY:
        inner, count = struct.unpack("<IQ", _read(f, 12))
        if inner in _SCALARS:
            f.seek(_SCALARS[inner] * count, 1)
        else:
            for _ in range(count):
                _skip(f, inner)
    else:
        raise ValueError


def architecture(path: Path) -> str | None:
    """The file's ``general.architecture``, or None when it is not a GGUF file this can read."""
    try:
        with path.open("rb") as f:
            if _read(f, 4) != b"GGUF":
                return None
            _version, _tensors, keys = struct.unpack("<IQQ", _read(f, 20))
            for _ in range(min(keys, MAX_KEYS)):
                name = _string(f)
                (kind,) = struct.unpack("<I", _read(f, 4))
                if name == b"general.architecture" and kind == _STRING:
                    return _string(f).decode("utf-8", "replace")
                _skip(f, kind)
    except (OSError, EOFError, ValueError, struct.error):
        return None
    return None
