"""``lanes bench-server``: OpenAI clients on loopback against a served model (``make bench-server``).

- ``--mode load``: ``--clients`` threads share ``--requests`` requests (a workload's chats, in turn),
  each streamed; errors, latency and first-token percentiles and aggregate completion tok/s.
- ``--mode agent``: each client runs sessions of ``resources/workloads/agent.jsonl`` turn by turn,
  resending the whole history with each turn (as coding agents do), against each ``--targets``
  server in turn with the same client: ``lanes`` (this engine, served in-process) and ``mlx-lm``
  (``python -m mlx_lm.server`` on the same model folder, a subprocess). Aggregate tok/s per target.

Greedy everywhere, so both servers are asked for the same text.
"""

from __future__ import annotations

import json
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.bench.workloads import load_workload

# One request's completion tokens, seconds, first-token seconds, and tokens copied (from Lanes' extra
# ``lanes`` field of the usage chunk; 0 from servers without it).
Measure = tuple[int, float, float, int]


def _percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    qs = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
    return {"p50": round(qs[49], 3), "p90": round(qs[89], 3), "p99": round(qs[98], 3), "max": round(max(xs), 3)}


def _chat(client: Any, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, Measure]:
    t0 = time.perf_counter()
    first, parts, tokens, copied = None, [], 0, 0
    for c in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                            stream=True, stream_options={"include_usage": True}):
        if c.choices and c.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - t0
            parts.append(c.choices[0].delta.content)
        if c.usage is not None:
            tokens = c.usage.completion_tokens
            origins = (c.model_extra or {}).get("lanes", {}).get("tokens_by_origin", {})
            copied = origins.get("context", 0) + origins.get("recall", 0)
    return "".join(parts), (tokens, time.perf_counter() - t0, first or 0.0, copied)


def run_clients(url: str, jobs: list[Callable[[Any], list[Measure]]], clients: int) -> dict[str, Any]:
    """Run ``jobs`` on ``clients`` threads, each with its own OpenAI client; their measurements summed."""
    import openai

    todo: queue.Queue[Callable[[Any], list[Measure]]] = queue.Queue()
    for j in jobs:
        todo.put(j)
    done: list[Measure] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
        while True:
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            try:
                got = job(client)
                with lock:
                    done.extend(got)
            except Exception as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, name=f"bench-client-{i}") for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(d[0] for d in done)
    return {"requests": len(done), "errors": errors, "seconds": round(wall, 3), "completion_tokens": tokens,
            "copied_tokens": sum(d[3] for d in done),
            "tok_s": round(tokens / wall, 2) if wall > 0 else 0.0,
            "latency_s": _percentiles([d[1] for d in done]), "first_token_s": _percentiles([d[2] for d in done])}


def load_jobs(model: str, workload: Path, requests: int, max_tokens: int | None) -> list[Callable[[Any], Any]]:
    items = load_workload(workload, max_tokens)

    def job(item: Any) -> Callable[[Any], list[Measure]]:
        def run(client: Any) -> list[Measure]:
            return [_chat(client, model, [dict(m) for m in item.messages], item.max_tokens)[1]]
        return run

    return [job(items[i % len(items)]) for i in range(requests)]


def agent_jobs(model: str, sessions: Path) -> list[Callable[[Any], Any]]:
    lines = [json.loads(line) for line in sessions.read_text().splitlines() if line.strip()]

    def job(s: dict[str, Any]) -> Callable[[Any], list[Measure]]:
        def run(client: Any) -> list[Measure]:
            history = [{"role": "system", "content": s["system"]}] if s.get("system") else []
            out = []
            for turn in s["turns"]:
                history.append({"role": "user", "content": turn})
                text, measure = _chat(client, model, history, s["max_tokens"])
                history.append({"role": "assistant", "content": text})
                out.append(measure)
            return out
        return run

    return [job(s) for s in lines]


def _warm_up(model: str) -> Callable[[Any], list[Measure]]:
    """A short chat unlike any workload's, so a server's caches and Recall hold nothing a measured
    request could reuse."""
    def run(client: Any) -> list[Measure]:
        return [_chat(client, model, [{"role": "user", "content": "Name three colours."}], 16)[1]]
    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(target: str, model: str | None) -> Iterator[tuple[str, str]]:
    """(URL, model name) of ``target`` serving ``model`` until the block ends."""
    if target == "lanes":
        from engine.rounds.engine_thread import Engine
        from engine.server.server import ApiServer

        with Engine(model) as engine:
            server = ApiServer(engine, port=0)
            server.start()
            try:
                yield server.url, engine.info().name
            finally:
                server.stop()
        return
    if target != "mlx-lm":
        raise ValueError(f"unknown target '{target}' (lanes, mlx-lm)")
    if model is None or not Path(model).is_dir():
        raise ValueError("mlx-lm's server needs a model folder: make one with `lanes make-model embedded-as-llama DIR`")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", str(port),
                             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(port, proc)
        yield f"http://127.0.0.1:{port}/v1", model
    finally:
        proc.terminate()
        proc.wait(30)


def _wait_for(port: int, proc: subprocess.Popen[bytes], seconds: float = 120.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"mlx_lm.server exited: {(proc.stderr.read() if proc.stderr else b'').decode()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"mlx_lm.server did not listen on port {port} within {seconds:.0f} s")


def model_architecture(model: str | None) -> str:
    """The model's mlx-lm architecture where it is a folder (the embedded one is llama)."""
    config = Path(model) / "config.json" if model else None
    if config is None or not config.is_file():
        return "llama" if model is None else "?"
    return str(json.loads(config.read_text()).get("model_type", "?"))


def main(args: Any) -> int:
    from engine.bench.runner import machine

    results: dict[str, Any] = {"mode": args.mode, "clients": args.clients, "model": args.model or "embedded",
                               "architecture": model_architecture(args.model), "machine": machine(), "measured": time.strftime("%Y-%m-%d"), "targets": {}}
    for target in args.targets.split(","):
        with served(target, args.model) as (url, name):
            if args.mode == "load":
                jobs = load_jobs(name, args.workload, args.requests, args.max_tokens)
            else:
                jobs = agent_jobs(name, args.sessions)
            run_clients(url, [_warm_up(name)] * args.clients, args.clients)  # kernels compile; nothing to copy
            r = run_clients(url, jobs, args.clients)
        results["targets"][target] = r
        print(f"{target}: {r['requests']} requests, {len(r['errors'])} errors, {r['tok_s']} tok/s, "
              f"latency {r['latency_s']}, first token {r['first_token_s']}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["errors"] for r in results["targets"].values()) else 0
