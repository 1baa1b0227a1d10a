"""Time to first token reopening a long chat, with its KV file on disk and without, side by side, on
the embedded model: a new engine each time, as after a restart (engine/model/kv_files.py).

    $(.venv/bin/python -m engine.model.openblas | sed 's/^/env /') .venv/bin/python scripts/kv_reopen.py [TURNS]

TURNS (default 120) question-and-answer pairs make the chat; the first run writes the file as its
engine closes, then each repeat reopens the chat once without a file and once with it.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.events import Finished, Request
from engine.model.loading import load_model
from engine.rounds.engine_thread import Engine

REPEATS = 2


def chat(turns: int, question: str) -> tuple[dict[str, str], ...]:
    out = [{"role": "system", "content": "You are a terse assistant."}]
    for i in range(turns):
        out += [{"role": "user", "content": f"Tell me fact number {i} about lighthouses and their keepers, please."},
                {"role": "assistant", "content": f"Fact {i}: lighthouse keepers trimmed wicks and logged the ships."}]
    return (*out, {"role": "user", "content": question})


def reply(loaded: Any, kv: Path, messages: tuple[dict[str, str], ...], label: str) -> None:
    engine = Engine(loader=lambda _spec: loaded, calibrate=False, kv_dir=kv)
    done = engine.submit(Request(messages=messages, max_tokens=8, conversation="c1")).wait()
    assert isinstance(done, Finished), done
    start = time.perf_counter()
    engine.close(timeout=None)  # writes the conversation's file
    print(f"{label}: first token {done.stats.first_token_s:.2f} s, reused {done.stats.prefill_reused} of "
          f"{done.stats.prompt_tokens} prompt tokens, close {time.perf_counter() - start:.2f} s", flush=True)


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    loaded = load_model(None)
    root = Path(tempfile.mkdtemp(prefix="lanes-kv-reopen-"))
    reply(loaded, root / "kv", chat(turns, "Which fact was the last one?"), "first turn (writes the file)")
    size = sum(f.stat().st_size for f in (root / "kv").rglob("*.safetensors"))
    print(f"file: {size / 2**20:.1f} MiB", flush=True)
    for i in range(REPEATS):
        again = chat(turns, "And the one before?")
        reply(loaded, root / f"none{i}", again, f"reopened without the file #{i + 1}")
        reply(loaded, root / "kv", again, f"reopened with the file #{i + 1}")


if __name__ == "__main__":
    main()
