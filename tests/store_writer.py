"""A child process that writes replies into a data folder as the window does, for the tests that run
other processes beside it and kill it (tests/test_store_processes.py).

    python -m tests.store_writer DB_PATH [--replies N] [--delay S]

One long-lived Store for the whole process, as the app has; a reply streams through ``ChatSession``
(progress saved every half second, the end made durable) on the scripted engine of
tests/fake_engine.py. After each reply, and before the next one starts, a second Store is opened and
closed in this process, as each reply's thread once did: the trigger of the lost-WAL bug. Each
committed reply is printed as ``committed CONV USER_ID REPLY_ID LENGTH`` once its last commit
returned, so the parent knows what must survive a kill.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.service.session import ChatSession, ReplySettings
from engine.store.store import Store
from tests.fake_engine import FakeEngine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("db", type=Path)
    parser.add_argument("--replies", type=int, default=1_000_000)
    parser.add_argument("--delay", type=float, default=0.002)
    args = parser.parse_args(argv)
    store = Store(args.db)
    print("ready", flush=True)
    with FakeEngine(delay=args.delay) as engine:
        session = ChatSession(store, engine, "Fake-Echo")
        for i in range(args.replies):
            conv = session.new_conversation()
            reply = session.ask(conv.id, f"reply {i} " + "words to echo back " * 20, ReplySettings())
            user = store.messages(conv.id)[0]
            print(f"committed {conv.id} {user.id} {reply.id} {len(reply.content)}", flush=True)
            Store(args.db).close()  # a second connection of this process, opened and closed
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
