"""``lanes serve``: the model behind a local OpenAI-compatible API until Ctrl+C (``engine.server``).
Requests are saved as conversations only with ``--save-conversations`` (the window's Server menu
follows the store's setting instead: ``engine.service.api_saving``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from functools import partial

from engine.rounds.engine_thread import Engine
from engine.server.app import ServerOptions
from engine.server.server import ApiServer


def serve_command(args: argparse.Namespace) -> int:
    store = None
    if args.save_conversations:
        from engine.service.api_saving import saver
        from engine.store.store import Store

        store = Store.open(args.data_dir)
    options = ServerOptions(api_key=args.api_key or None, cors_origins=tuple(args.cors_origin),
                            max_body=int(args.max_body_mb * 2**20), max_requests=args.max_requests)
    limit = None if args.memory_limit_gb is None else int(args.memory_limit_gb * 2**30)
    # No KV folder: API requests name no conversation, so their prefixes stay in memory (engine.model.turn_cache).
    engine = Engine(args.model, memory_limit=limit)
    try:
        print("loading the model…", file=sys.stderr, flush=True)
        info = engine.info()
        if store is not None:
            options = replace(options, save=partial(saver(info.name), store))
        server = ApiServer(engine, args.host, args.port, options, aliases=[args.model] if args.model else [])
        server.start()
        print(f"Lanes serves {info.name} ({info.device}) at {server.url}", flush=True)
        print(f"  e.g. OpenAI(base_url=\"{server.url}\", api_key=\"{args.api_key or 'lanes'}\")"
              f" with model=\"{info.name}\"; Ctrl+C stops", flush=True)
        try:
            server.wait()
        except KeyboardInterrupt:
            print("stopping…", file=sys.stderr)
        finally:
            server.stop()
    finally:
        engine.close()
        if store is not None:
            store.close()
    return 0
