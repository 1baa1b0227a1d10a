"""The API's routes (Starlette): ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/health``.

Every request becomes an engine ``Request`` and so a stream in the shared rounds; its KV cache is
kept and found again by the longest common token prefix (``Request.prefix_cache``), and its text
(prompt and reply) goes to Recall, so that a client that resends a growing history, or re-emits a
file it was shown, skips the prefill and copies. A client that hangs up cancels its stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.events import Event, Failed, Finished, ModelInfo, Request, Tokens
from engine.rounds.engine_thread import Engine, Handle
from engine.server.api_errors import ApiError, engine_error
from engine.server.replies import Call, TextStream, chunk, sse, whole
from engine.server.schema import ChatBody, CompletionBody, Sampling, parse
from engine.server.tool_calls import ToolFormat

log = logging.getLogger(__name__)

RECALL_DOCS = 64  # API conversations Recall holds at once, least recently used dropped


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None  # checked on every request when set (required off loopback)
    cors_origins: tuple[str, ...] = ()  # CORS stays off unless origins are named
    max_body: int = 8 * 2**20  # bytes of a request body
    max_requests: int = 32  # running and queued at once; more answer 429
    temperature: float = 0.0  # when a request names none (mlx-lm's server's default)
    # Called with (request, reply) after each finished chat reply, on a worker thread: saving API
    # requests as conversations, when a setting asks for it (``engine.service.api_saving``).
    save: Callable[[Request, Finished], None] | None = None


class ApiService:
    """What the routes share: the engine, the model's names and the requests running."""

    def __init__(self, engine: Engine, info: ModelInfo, tokenizer: Any, options: ServerOptions,
                 aliases: Sequence[str] = (), on_change: Callable[[int], None] | None = None) -> None:
        self.engine, self.info, self.options = engine, info, options
        self.names = {info.name, *(a for a in aliases if a)}
        self.tool_format = ToolFormat.of(tokenizer)
        self.running = 0
        self.on_change = on_change
        self.recall_docs: OrderedDict[str, None] = OrderedDict()

    def check_model(self, name: str) -> None:
        if name not in self.names:
            raise ApiError(404, f"model '{name}' is not served here; this server runs '{self.info.name}'",
                           code="model_not_found", param="model")

    def _count(self, step: int) -> None:
        self.running += step
        if self.on_change is not None:
            self.on_change(self.running)

    def request(self, body: Sampling, messages: tuple[dict[str, Any], ...] = (),
                prompt: tuple[int, ...] | None = None, tools: Sequence[dict[str, Any]] = ()) -> Request:
        return Request(messages=messages, prompt_tokens=prompt, max_tokens=body.limit(),
                       temperature=self.options.temperature if body.temperature is None else body.temperature,
                       top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed, stop=body.stops(),
                       prefix_cache=True, tools=tuple(tools), recall_exclude=_doc_id(messages, prompt))

    async def remember(self, request: Request, done: Finished) -> None:
        """The request's text and its reply, as one Recall document per client conversation (keyed by
        its opening), replaced as the conversation grows."""
        doc = request.recall_exclude
        assert doc is not None
        text = "\n\n".join(str(m.get("content") or "") for m in request.messages)
        tokens = await asyncio.to_thread(self.engine.encode, text) if text else list(request.prompt_tokens or ())
        self.engine.add_recall_many({doc: [*tokens, *done.tokens]})
        self.recall_docs[doc] = None
        self.recall_docs.move_to_end(doc)
        while len(self.recall_docs) > RECALL_DOCS:
            self.engine.remove_recall(self.recall_docs.popitem(last=False)[0])


def _doc_id(messages: Sequence[dict[str, Any]], prompt: Sequence[int] | None) -> str:
    opening = json.dumps(list(messages[:2]) if messages else list(prompt or ())[:256], sort_keys=True)
    return "api:" + hashlib.sha256(opening.encode()).hexdigest()[:16]


# -- routes ------------------------------------------------------------------
async def health(http: HttpRequest) -> Response:
    svc: ApiService = http.app.state.service
    return JSONResponse({"status": "ok", "model": svc.info.name, "running": svc.running})


async def models(http: HttpRequest) -> Response:
    svc: ApiService = http.app.state.service
    return JSONResponse({"object": "list", "data": [_model(svc)]})


async def model(http: HttpRequest) -> Response:
    svc: ApiService = http.app.state.service
    svc.check_model(http.path_params["name"])
    return JSONResponse(_model(svc))


def _model(svc: ApiService) -> dict[str, Any]:
    return {"id": svc.info.name, "object": "model", "created": 0, "owned_by": "lanes",
            "context_length": svc.info.context_length}


async def chat(http: HttpRequest) -> Response:
    svc: ApiService = http.app.state.service
    body = parse(ChatBody, await _body(http, svc.options.max_body))
    svc.check_model(body.model)
    tools = body.tools or []
    request = svc.request(body, body.engine_messages(), tools=tools)
    call = Call("chat", svc.info.name, body.include_usage, request.stop,
                svc.tool_format if tools else None, tools)
    return await _answer(http, svc, request, call, body.stream)


async def completions(http: HttpRequest) -> Response:
    svc: ApiService = http.app.state.service
    body = parse(CompletionBody, await _body(http, svc.options.max_body))
    svc.check_model(body.model)
    if body.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    prompt = tuple(await asyncio.to_thread(svc.engine.encode, body.text()))
    request = svc.request(body, prompt=prompt)
    return await _answer(http, svc, request, Call("text", svc.info.name, body.include_usage, request.stop),
                         body.stream)


async def _body(http: HttpRequest, limit: int) -> bytes:
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body of {int(declared):,} bytes is over this server's limit of {limit:,}",
                       code="request_too_large")
    chunks, size = [], 0
    async for part in http.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"the request body is over this server's limit of {limit:,} bytes",
                           code="request_too_large")
        chunks.append(part)
    return b"".join(chunks)


async def _answer(http: HttpRequest, svc: ApiService, request: Request, call: Call, stream: bool) -> Response:
    if svc.running >= svc.options.max_requests:
        raise ApiError(429, f"{svc.running} requests are running or queued, the most this server takes at once; "
                       "try again when one finishes", "rate_limit_error", "too_many_requests")
    run = _Running(svc, svc.engine.submit(request), http)
    handed_over = False
    try:
        first = await _first(run.events)
        if isinstance(first, Failed):
            raise engine_error(first.kind, first.message)
        if stream:
            handed_over = True  # the chunks' generator ends the run
            return StreamingResponse(_chunks(svc, request, call, first, run), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        done = first
        while not isinstance(done, Finished):
            done = await anext(run.events)
            if isinstance(done, Failed):
                raise engine_error(done.kind, done.message)
        await _finished(svc, request, done)
        return JSONResponse(whole(call, done))
    finally:
        if not handed_over:
            run.end()


class _Running:
    """One request in the engine: counted while it runs, cancelled when its client hangs up or it
    ends unfinished."""

    def __init__(self, svc: ApiService, handle: Handle, http: HttpRequest) -> None:
        self.svc, self.handle = svc, handle
        self.events = aiter(handle)
        self.watcher = asyncio.create_task(self._cancel_on_hangup(http))
        self.ended = False
        svc._count(+1)

    async def _cancel_on_hangup(self, http: HttpRequest) -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass
        self.handle.cancel()

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.watcher.cancel()
        if self.handle.result is None:
            self.handle.cancel()
        self.svc._count(-1)


async def _first(events: AsyncIterator[Event]) -> Event:
    """The first event that says how the request went: its first tokens, its end, or its failure."""
    while True:
        event = await anext(events)
        if isinstance(event, Tokens | Finished | Failed):
            return event


async def _chunks(svc: ApiService, request: Request, call: Call, first: Event, run: _Running) -> AsyncIterator[str]:
    text = TextStream(call)
    try:
        if call.kind == "chat":
            yield chunk(call, {"role": "assistant", "content": ""})
        event = first
        while True:
            if isinstance(event, Tokens) and (delta := text.add(event.text)):
                yield chunk(call, {"content": delta})
            elif isinstance(event, Failed):
                yield sse(engine_error(event.kind, event.message).body())
                return
            elif isinstance(event, Finished):
                rest, calls = text.finish(event)
                if rest:
                    yield chunk(call, {"content": rest})
                if calls:
                    yield chunk(call, {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
                yield chunk(call, {}, "tool_calls" if calls else "length" if event.reason == "length" else "stop")
                if call.include_usage:
                    yield chunk(call, done=event)
                yield sse("[DONE]")
                await _finished(svc, request, event)
                return
            event = await anext(run.events)
    finally:
        run.end()


async def _finished(svc: ApiService, request: Request, done: Finished) -> None:
    if done.reason == "cancelled":
        return
    await svc.remember(request, done)
    if svc.options.save is not None and request.messages:
        try:
            await asyncio.to_thread(svc.options.save, request, done)
        except Exception:  # a reply is still answered when the store cannot take it; the log says why
            log.exception("saving an API request as a conversation failed")


# -- the app -----------------------------------------------------------------
def _guarded(handler: Callable[[HttpRequest], Awaitable[Response]]) -> Callable[[HttpRequest], Awaitable[Response]]:
    """Errors in OpenAI's shape; an unforeseen one is a 500 with its message, never a traceback."""

    async def run(http: HttpRequest) -> Response:
        svc: ApiService = http.app.state.service
        key = svc.options.api_key
        if key is not None and not hmac.compare_digest(http.headers.get("authorization", ""), f"Bearer {key}"):
            return ApiError(401, "a valid API key is required: send it as 'Authorization: Bearer <key>'",
                            code="invalid_api_key").response()
        try:
            return await handler(http)
        except ApiError as exc:
            return exc.response()
        except Exception as exc:
            log.exception("API request failed")
            return ApiError(500, f"the server failed: {type(exc).__name__}: {exc}", "server_error",
                            "internal_error").response()

    return run


async def _http_error(http: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return ApiError(exc.status_code, f"{http.method} {http.url.path}: {exc.detail}",
                    code="not_found" if exc.status_code == 404 else None).response()


def make_app(service: ApiService) -> Starlette:
    routes = [
        Route("/health", _guarded(health)),
        Route("/v1/models", _guarded(models)),
        Route("/v1/models/{name:path}", _guarded(model)),
        Route("/v1/chat/completions", _guarded(chat), methods=["POST"]),
        Route("/v1/completions", _guarded(completions), methods=["POST"]),
    ]
    middleware = []
    if service.options.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(service.options.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["*"]))
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error})
    app.state.service = service
    return app
