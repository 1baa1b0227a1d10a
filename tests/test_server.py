"""The OpenAI-compatible server on loopback, driven by the official ``openai`` client: a real
server (uvicorn on its own thread) over a real engine on the embedded model."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
import time

import httpx2 as httpx
import openai
import pytest

from engine.errors import LanesError, MemoryLimitError
from engine.model.memory_limits import weight_bytes
from engine.rounds.engine_thread import Engine
from engine.server.app import ServerOptions
from engine.server.server import ApiServer
from tests import prompts

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def engine(loaded):
    eng = Engine(loader=lambda _spec: loaded, calibrate=False)
    eng.info(timeout=60)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine):
    srv = ApiServer(engine, port=0)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def wait_idle(engine: Engine, server: ApiServer, seconds: float = 10.0) -> bool:
    """Whether the server and the engine run nothing within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        busy = engine.run_sync(lambda s: len(s.active) + len(s.joining) + len(s.waiting), timeout=30)
        if busy == 0 and server.running == 0:
            return True
        time.sleep(0.05)
    return False


def test_models_and_health(client, server) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(server.url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL


def test_chat_is_mlx_lm_greedy_with_usage_and_copy_statistics(client, loaded, reference, chat_prompt) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=user(prompts.COPY), max_tokens=40, temperature=0)
    prompt = chat_prompt(prompts.COPY)
    assert reply.choices[0].message.content == loaded.tokenizer.decode(reference(prompt, 40))
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(reference(prompt, 40))
    assert reply.choices[0].finish_reason in ("stop", "length")
    copies = reply.model_extra["lanes"]
    assert copies["tokens_by_origin"]["context"] > 0  # the sentence is copied from the prompt
    assert sum(copies["tokens_by_origin"].values()) == reply.usage.completion_tokens


def test_stream_equals_whole_reply_and_reports_usage(client) -> None:
    kw = {"model": MODEL, "messages": user(prompts.TYPOS), "max_tokens": 48, "temperature": 0}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    # The same history again: its prompt's KV cache is found by its tokens.
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1


def test_a_resent_history_reuses_the_cache_of_the_reply_it_extends(client) -> None:
    history = [{"role": "system", "content": "You are terse."}, *user(prompts.CODE)]
    first = client.chat.completions.create(model=MODEL, messages=history, max_tokens=32, temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content}, *user("Thanks. Again?")]
    second = client.chat.completions.create(model=MODEL, messages=history, max_tokens=16, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens


def test_stop_sequences_are_cut_from_streamed_and_whole_text(client) -> None:
    kw = {"model": MODEL, "messages": user(prompts.COPY), "max_tokens": 40, "temperature": 0}
    free = client.chat.completions.create(**kw).choices[0].message.content
    stop = free[10:14]
    whole = client.chat.completions.create(**kw, stop=[stop])
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stop=stop, stream=True)
                       if c.choices)
    assert whole.choices[0].message.content == streamed == free[: free.index(stop)]
    assert whole.choices[0].finish_reason == "stop"


def test_completions_whole_and_streamed(client, loaded, reference) -> None:
    text = "The capital of France is"
    done = client.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
    expected = loaded.tokenizer.decode(reference(loaded.tokenizer.encode(text, add_special_tokens=False), 8))
    assert done.choices[0].text == expected
    assert done.usage.completion_tokens == 8 and done.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(model=MODEL, prompt=text, max_tokens=8,
                                                                              temperature=0, stream=True))
    assert streamed == expected


def test_tool_messages_go_through_the_chat_template(client) -> None:
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    messages = [*user("What is in notes.txt?"),
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Buy milk. Call Anna at five."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=24, temperature=0)
    # SmolLM2's template has no tool calls: the answer is text, after the tool's result in the prompt.
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None
    assert reply.usage.prompt_tokens > 20


def test_four_requests_at_once_equal_each_alone_and_finish_sooner(client) -> None:
    texts = [prompts.COPY, prompts.TYPOS, prompts.CODE, prompts.TABLE]

    def ask(text: str) -> str:
        return client.chat.completions.create(model=MODEL, messages=user(text + " Please."), max_tokens=48,
                                              temperature=0).choices[0].message.content

    t0 = time.perf_counter()
    alone = [ask(t) for t in texts]
    one_by_one = time.perf_counter() - t0
    for t in texts:  # the same prompts again at once: each reuses its cache, as the ones above did
        ask(t)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, texts))
    at_once = time.perf_counter() - t0
    assert together == alone
    assert at_once < one_by_one


def test_a_client_that_hangs_up_cancels_its_stream(server, engine) -> None:
    # A reply of hundreds of tokens (greedy, it runs past 300), so it is still running after its first chunks.
    long = "Write a long story about a lighthouse keeper."
    body = {"model": MODEL, "messages": user(long), "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", server.url + "/chat/completions", json=body) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the response, which is a hang-up too
        data = [line for line in itertools.islice(lines, 6) if line.startswith("data:")]
        assert len(data) == 3 and server.running == 1
    assert wait_idle(engine, server)


def test_errors_have_openais_shape(client, server) -> None:
    url = server.url + "/chat/completions"
    bad = httpx.post(url, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    typed = httpx.post(url, json={"model": MODEL, "messages": user("hi"), "max_tokens": "5"})
    assert typed.status_code == 400
    assert typed.json()["error"] == {"message": "max_tokens: Input should be a valid integer",
                                     "type": "invalid_request_error", "param": "max_tokens", "code": None}
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4o' is not served here"):
        client.chat.completions.create(model="gpt-4o", messages=user("hi"))
    with pytest.raises(openai.BadRequestError, match="context limit of 8192 tokens") as long:
        client.chat.completions.create(model=MODEL, messages=user("word " * 9000))
    assert long.value.code == "context_length_exceeded"
    assert httpx.get(server.url + "/nowhere").json()["error"]["code"] == "not_found"


def test_limits_answer_413_and_429_instead_of_hanging(engine) -> None:
    srv = ApiServer(engine, port=0, options=ServerOptions(max_body=2000, max_requests=1))
    srv.start()
    try:
        c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.APIStatusError, match="over this server's limit of 2,000") as big:
            c.chat.completions.create(model=MODEL, messages=user("x" * 3000))
        assert big.value.status_code == 413
        stream = c.chat.completions.create(model=MODEL, messages=user(prompts.OPEN), max_tokens=200, stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError, match="the most this server takes at once"):
            c.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=4)
        stream.close()
        assert wait_idle(engine, srv)
        assert c.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=4).choices[0].message.content
    finally:
        srv.stop()


def test_a_request_beyond_the_memory_limit_is_answered_503_naming_it(loaded) -> None:
    limit = weight_bytes(loaded.model) + 96 * 2**20  # KV for ~1,200 tokens of the embedded model
    with Engine(loader=lambda _spec: loaded, calibrate=False, memory_limit=limit) as eng:
        srv = ApiServer(eng, port=0)
        srv.start()
        try:
            c = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=60)
            with pytest.raises(openai.APIStatusError, match="MiB of KV memory") as full:
                c.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=4000)
            assert full.value.status_code == 503 and full.value.code == "insufficient_memory"
            assert c.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=4).usage.completion_tokens
        finally:
            srv.stop()


def test_a_memory_limit_the_weights_fill_fails_the_load_by_name(loaded) -> None:
    with Engine(loader=lambda _spec: loaded, calibrate=False, memory_limit=2**20) as eng, \
            pytest.raises(MemoryLimitError, match="more than the memory limit of 1 MiB"):
        eng.info(timeout=60)


def test_another_interface_needs_an_api_key_checked_on_every_request(engine) -> None:
    with pytest.raises(LanesError, match="give an API key"):
        ApiServer(engine, host="0.0.0.0", port=0)
    srv = ApiServer(engine, host="0.0.0.0", port=0, options=ServerOptions(api_key="s3cret"))
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
        assert httpx.get(url + "/models").status_code == 401
        good = openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=4).usage.completion_tokens
    finally:
        srv.stop()


def test_a_port_in_use_is_refused_by_name(engine, server) -> None:
    with pytest.raises(LanesError, match=f"cannot serve on 127.0.0.1:{server.port}"):
        ApiServer(engine, port=server.port).start()


def test_cors_is_off_unless_asked_for(engine, server) -> None:
    preflight = {"Origin": "http://example.test", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in httpx.options(server.url + "/chat/completions", headers=preflight).headers
    srv = ApiServer(engine, port=0, options=ServerOptions(cors_origins=("http://example.test",)))
    srv.start()
    try:
        r = httpx.options(srv.url + "/chat/completions", headers=preflight)
        assert r.headers["access-control-allow-origin"] == "http://example.test"
    finally:
        srv.stop()


def test_server_threads_are_joined_on_stop(engine) -> None:
    before = set(threading.enumerate())
    srv = ApiServer(engine, port=0)
    srv.start()
    started = set(threading.enumerate()) - before
    assert {t.name for t in started} >= {"lanes-api", "lanes-api-work_0"}
    srv.stop()
    assert not [t.name for t in started if t.is_alive()]


def test_stream_chunks_are_server_sent_events(server) -> None:
    body = {"model": MODEL, "messages": user("hi"), "max_tokens": 3, "stream": True}
    r = httpx.post(server.url + "/chat/completions", json=body, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
