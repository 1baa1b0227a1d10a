"""A conversation's KV cache on disk, so reopening a long chat after a restart skips its prefill.

The disk tier of ``engine.model.turn_cache.ConversationCache``. Each file is mlx-lm's prompt-cache
format (``save_prompt_cache``) at ``<data dir>/kv/<model id>/<conversation key>.safetensors``; its
metadata names the format, the model and the tokens the caches hold. A file is used exactly as an
entry held in memory (the same trimming and recurrent rules); one of another model or format, a
corrupt or partial one, or one holding cache kinds the model does not take is deleted and ignored.

Only turns of at least ``SAVE_FROM_TOKENS`` are written: a shorter prompt prefills faster than its
file loads. Writes go to a hidden temporary file renamed over the old one, so a process killed mid
write leaves the previous file (or none), never half of one; a temporary file a killed process
left is removed once older than ``STALE_TMP_S``.

All of ``kv/`` (every model's folder) shares one budget: past it, the least recently used files
(a file's modification time, refreshed when it is loaded) are deleted first (``to_evict``).

The engine thread writes and reads these files (they hold MLX arrays); ``remove_conversation`` and
``to_evict`` touch no MLX and serve ``lanes delete``, which runs no engine. A file is read whole as
its conversation's turn joins: one stall of the running streams for a read, where the prefill it
replaces would have taken chunk after chunk of rounds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, load_prompt_cache, save_prompt_cache

from engine.model.cache_kinds import LayerKind, cache_arrays

log = logging.getLogger(__name__)

SAVE_FROM_TOKENS = 512  # a turn holding fewer tokens is not written (read at call time: tests lower it)
DISK_BUDGET = 2 * 2**30  # bytes of every model's files together
FORMAT = "lanes-kv-1"  # changed when what a file holds, or how Lanes computes KV, changes
STALE_TMP_S = 3600.0
SUFFIX = ".safetensors"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,100}")


def folder(data_dir: Path) -> Path:
    """Where a data dir keeps its KV files (beside the database)."""
    return data_dir / "kv"


@dataclass(frozen=True)
class KvFile:
    path: Path
    size: int  # bytes
    used: float  # last written or loaded (the file's modification time)


def to_evict(files: Sequence[KvFile], budget: int) -> list[KvFile]:
    """The files to delete, least recently used first, so that the rest fit in ``budget`` bytes.

    Worked example: a (100 bytes, used at t=1), b (300, t=3), c (200, t=2) with a budget of 400:
    together 600, so a goes (500 left), then c (300 left, within the budget): [a, c]; b, the most
    recently used, stays. The file just written is the newest, so it goes last (only if it alone
    is over the budget)."""
    total = sum(f.size for f in files)
    out: list[KvFile] = []
    for f in sorted(files, key=lambda f: f.used):
        if total <= budget:
            break
        out.append(f)
        total -= f.size
    return out


def file_name(key: str) -> str:
    """A conversation key as a file name: itself when plain (``c12``), else its hash."""
    stem = key if _PLAIN_KEY.fullmatch(key) else "h" + hashlib.sha256(key.encode()).hexdigest()[:32]
    return stem + SUFFIX


def model_id(name: str, path: Path, device: str) -> str:
    """A short hash naming the model's KV: its name, where its weights are (and their sizes and
    times, so replaced weights start afresh), the device (on the CPU Lanes runs in float32) and the
    file format."""
    weights = [path] if path.is_file() else sorted(p for p in path.glob("*") if p.suffix in (".safetensors", ".gguf"))
    parts = [FORMAT, name, str(path.resolve()), device]
    for p in weights:
        with contextlib.suppress(OSError):
            st = p.stat()
            parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def scan(root: Path) -> list[KvFile]:
    """Every KV file under ``root`` (all models); temporary files left by killed writers are removed."""
    out: list[KvFile] = []
    now = time.time()
    for p in root.glob("*/*" + SUFFIX):
        try:
            st = p.stat()
        except OSError:
            continue  # removed meanwhile (another process's budget)
        if p.name.startswith("."):
            if now - st.st_mtime > STALE_TMP_S:
                with contextlib.suppress(OSError):
                    p.unlink()
            continue
        out.append(KvFile(p, st.st_size, st.st_mtime))
    return out


def remove_conversation(root: Path, key: str) -> int:
    """Delete the conversation's files of every model under ``root``; returns how many there were."""
    n = 0
    for p in root.glob("*/" + file_name(key)):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


class KvFiles:
    """One model's folder of KV files under ``root`` (the data dir's ``kv``), within ``budget`` bytes."""

    def __init__(self, root: Path, model: str, kinds: Sequence[LayerKind], budget: int = DISK_BUDGET) -> None:
        self.root = root
        self.model = model  # model_id(...)
        self.kinds = list(kinds)
        self.budget = budget

    def path(self, key: str) -> Path:
        return self.root / self.model / file_name(key)

    @staticmethod
    def worth_saving(tokens: Sequence[int]) -> bool:
        return len(tokens) >= SAVE_FROM_TOKENS

    def save(self, key: str, tokens: Sequence[int], caches: list[Any]) -> bool:
        """Write the caches (holding exactly ``tokens``), then keep every model's files within the
        budget. A failure (a full disk) is logged, never raised: the chat goes on without the file."""
        if sum(c.nbytes for c in caches) > self.budget:
            return False
        final = self.path(key)
        tmp = final.with_name(f".{final.stem}.{os.getpid()}{SUFFIX}")  # hidden: never loaded, nor counted
        meta = {"format": FORMAT, "model": self.model, "tokens": json.dumps(list(tokens), separators=(",", ":"))}
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            save_prompt_cache(str(tmp), caches, meta)
            os.replace(tmp, final)
        except Exception as exc:
            log.warning("could not save the KV cache of %s to %s: %s", key, final, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        for f in to_evict(scan(self.root), self.budget):
            with contextlib.suppress(OSError):
                f.path.unlink()
        return True

    def load(self, key: str) -> tuple[tuple[int, ...], list[Any]] | None:
        """The tokens and caches saved for ``key``, or None; a file that cannot be this model's KV is
        deleted."""
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            caches, meta = load_prompt_cache(str(p), return_metadata=True)
            if meta.get("format") != FORMAT or meta.get("model") != self.model:
                raise ValueError(f"written for {meta.get('model')!r} ({meta.get('format')!r})")
            tokens = tuple(int(t) for t in json.loads(meta["tokens"]))
            self._check(caches, len(tokens))
            mx.eval(cache_arrays(caches))  # read it all now: a short file fails here, not mid-round
        except Exception as exc:  # whatever a damaged file raises, the chat prefills instead
            log.warning("ignoring (deleting) the KV file %s: %s", p, exc)
            with contextlib.suppress(OSError):
                p.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(p)  # recently used: the budget removes it last
        return tokens, caches

    def _check(self, caches: list[Any], n: int) -> None:
        """Raise unless ``caches`` are one stream's caches of this model's layer kinds holding ``n`` tokens."""
        if len(caches) != len(self.kinds) or n < 1:
            raise ValueError(f"{len(caches)} caches for {len(self.kinds)} layers, {n} tokens")
        for kind, c in zip(self.kinds, caches, strict=True):
            if kind.recurrent:
                ok = (type(c) is ArraysCache and len(c.cache) == kind.states
                      and all(a is None or a.shape[0] == 1 for a in c.cache))
            else:
                ok = (type(c) is KVCache and c.keys is not None and c.values is not None and c.offset == n
                      and c.keys.shape[0] == 1 and c.keys.shape[:3] == c.values.shape[:3])
            if not ok:
                raise ValueError(f"a {type(c).__name__} where the model has {kind}")
