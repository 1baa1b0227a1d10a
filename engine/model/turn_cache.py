"""KV caches of finished turns, kept so a conversation's next turn skips prefill.

Bounded by bytes and evicted least-recently-used. A cache is *taken* while a
stream uses it (two concurrent turns of one conversation cannot share buffers that
both would write) and *put* back when the stream ends.

Attention caches are trimmed to the prefix the next prompt shares. A recurrent
layer's state (``ArraysCache``) holds all of its tokens and cannot be trimmed, so
a model with such layers reuses a turn's caches only when the new prompt starts
with every token they hold (a follow-up turn whose template re-renders the earlier
ones unchanged).

Requests that name no conversation (the API server's: each resends its whole history) are
kept under ``PREFIX`` keys and found by the longest common token prefix instead
(``take_longest``). Worked example: cached ``prefix:r1`` holds tokens [1, 2, 3, 4]; a prompt
[1, 2, 3, 9] takes it trimmed to [1, 2, 3] (3 of 4 held tokens: more than half, so the entry
itself is used); a prompt [1, 7] shares only [1], so it gets a copy of that one position and
``prefix:r1`` stays for the client whose history it is.

With a disk tier (``disk``: ``engine.model.kv_files``), a conversation missing here is looked for
on disk, and a put turn long enough to be worth a file is marked unsaved. The owner of the MLX
thread writes unsaved entries with ``save_next`` when it is idle and ``save_all`` when it closes:
writing a long chat's KV (hundreds of MB for a float32 model on the CPU) mid-round would stall
every running stream that long, while a chat's next turn rarely comes within a second of its
reply. An unsaved entry leaving memory first (evicted, or larger than the whole budget) is written
as it leaves, the one stall worth paying: it would be lost otherwise. ``PREFIX`` entries (the API
server's, found by their tokens) are never written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import ArraysCache, KVCache

from engine.model.kv_files import KvFiles
from engine.model.machine import trim_heap

PREFIX = "prefix:"  # keys of requests found by their tokens rather than by a conversation


@dataclass
class Entry:
    tokens: tuple[int, ...]  # exactly the tokens whose keys and values (and states) the caches hold
    caches: list[Any]  # KVCache or ArraysCache, one per cached layer

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ConversationCache:
    def __init__(self, max_bytes: int = 512 * 2**20, disk: KvFiles | None = None) -> None:
        self.max_bytes = max_bytes
        self.disk = disk
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._unsaved: set[str] = set()  # held here, newer than their file, and worth one
        self._forgotten: set[str] = set()  # deleted conversations: a reply still running is not kept

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, conversation: str, prompt: Sequence[int]) -> tuple[list[Any], int] | None:
        """Remove and return (caches trimmed to the shared prefix, reused tokens).

        At least one prompt token is left unreused: the stream's first row needs it.
        """
        self._forgotten.discard(conversation)  # a turn starting now is a new conversation's
        self._unsaved.discard(conversation)
        entry = self._entries.pop(conversation, None)
        if entry is None and self.disk is not None and not conversation.startswith(PREFIX):
            found = self.disk.load(conversation)
            entry = Entry(*found) if found is not None else None
        if entry is None:
            return None
        reuse = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
        if reuse <= 0:
            return None
        if reuse < len(entry.tokens) and any(isinstance(c, ArraysCache) for c in entry.caches):
            return None  # a recurrent state cannot go back to a shorter prefix
        for c in entry.caches:
            if not isinstance(c, ArraysCache):
                c.trim(c.offset - reuse)
        return entry.caches, reuse

    def take_longest(self, prompt: Sequence[int]) -> tuple[list[Any], int] | None:
        """The ``PREFIX`` entry sharing the longest token prefix with ``prompt``, as ``take`` gives it:
        taken whole when the prompt reuses at least half of it, else a copy of the shared positions
        (the entry stays for a prompt that continues it). None when nothing is shared."""
        best, key = 0, None
        for k, entry in self._entries.items():  # oldest first: on a tie, the most recent wins
            if not k.startswith(PREFIX):
                continue
            n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if n < len(entry.tokens) and any(isinstance(c, ArraysCache) for c in entry.caches):
                continue
            if n > 0 and n >= best:
                best, key = n, k
        if key is None:
            return None
        entry = self._entries[key]
        if 2 * best >= len(entry.tokens):
            return self.take(key, prompt)
        self._entries.move_to_end(key)
        copies = []
        for c in entry.caches:  # only KVCache here: a recurrent entry is never cut (above)
            kv = KVCache()
            kv.state = (c.keys[..., :best, :], c.values[..., :best, :], best)
            copies.append(kv)
        return copies, best

    def put(self, conversation: str, tokens: Sequence[int], caches: list[Any]) -> None:
        if conversation in self._forgotten:
            return
        self.drop(conversation)
        entry = Entry(tuple(tokens), caches)
        if (self.disk is not None and not conversation.startswith(PREFIX)
                and self.disk.worth_saving(entry.tokens)):
            self._unsaved.add(conversation)
        if entry.nbytes > self.max_bytes:
            self._leave(conversation, entry)
            return
        self._entries[conversation] = entry
        evicted = False
        while self.nbytes > self.max_bytes:
            self._leave(*self._entries.popitem(last=False))
            evicted = True
        if evicted:  # a turn's buffers under the mmap threshold leave holes the heap would keep
            trim_heap()

    def _leave(self, conversation: str, entry: Entry) -> None:
        if conversation in self._unsaved:
            self._unsaved.discard(conversation)
            assert self.disk is not None
            self.disk.save(conversation, entry.tokens, entry.caches)

    @property
    def unsaved(self) -> bool:
        return bool(self._unsaved)

    def save_next(self) -> None:
        """Write the most recently used unsaved entry to disk (it stays here too)."""
        key = next((k for k in reversed(self._entries) if k in self._unsaved), None)
        if key is None:  # never: every unsaved key is held here
            self._unsaved.clear()
            return
        self._unsaved.discard(key)
        entry = self._entries[key]
        assert self.disk is not None
        self.disk.save(key, entry.tokens, entry.caches)

    def save_all(self) -> None:
        while self._unsaved:
            self.save_next()

    def drop(self, conversation: str) -> None:
        self._entries.pop(conversation, None)
        self._unsaved.discard(conversation)

    def forget(self, conversation: str) -> None:
        """Drop a deleted conversation, and the caches of a reply of it still running when it ends
        (until a turn of that key starts again). Its files are the caller's to remove."""
        self.drop(conversation)
        self._forgotten.add(conversation)

    def clear(self) -> None:
        self._entries.clear()
        self._unsaved.clear()
