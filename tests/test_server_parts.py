"""The server's pure parts on literal data: tool calls, held-back text, error shapes, saving."""

from __future__ import annotations

import json

from mlx_lm.tool_parsers import json_tools

from engine.events import Finished, ReplyStats, Request, SourceCounts
from engine.server.api_errors import engine_error
from engine.server.replies import Call, TextStream, whole
from engine.server.tool_calls import ToolFormat, held_back, split

QWEN = ToolFormat("<tool_call>", "</tool_call>", json_tools.parse_tool_call)


def finished(text: str, reason: str = "eos") -> Finished:
    stats = ReplyStats(prompt_tokens=10, generated=4, seconds=0.5, first_token_s=0.1, prefill_reused=6, rounds=3,
                       rows={"context": SourceCounts(3, 2, 4), "recall": SourceCounts()})
    return Finished("r1", reason, (1, 2, 3, 4), ("model", "context", "context", "model"), text, stats, {})  # type: ignore[arg-type]


def test_tool_calls_are_cut_out_and_parsed() -> None:
    content, calls = split('Let me look.<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>', QWEN, None)
    assert content == "Let me look."
    assert [c["function"] for c in calls] == [{"name": "ls", "arguments": '{"path": "."}'}]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")


def test_a_call_the_parser_cannot_read_stays_text() -> None:
    text = "Sure.<tool_call>{not json</tool_call> done"
    assert split(text, QWEN, None) == (text, [])


def test_held_back_is_the_longest_marker_start_at_the_end() -> None:
    assert held_back("ab<to", ["<tool_call>"]) == 3
    assert held_back("ab<to", ["xyz"]) == 0
    assert held_back("say END", ["END!", "D"]) == 3


def test_streamed_content_never_shows_a_stop_or_a_call_and_ends_equal_to_the_whole() -> None:
    call = Call("chat", "m", stops=("STOP",), fmt=QWEN, tools=[])
    stream = TextStream(call)
    deltas = [stream.add(t) for t in ["Hello ", "ST", "ill <tool", '_call>{"name": "f", "arguments": {}}', "</tool_call>"]]
    assert deltas == ["Hello ", "", "STill ", "", ""]
    text = 'Hello STill <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    rest, calls = stream.finish(finished(text))
    assert rest == "" and [c["function"]["name"] for c in calls] == ["f"]
    body = whole(call, finished(text))
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    message = body["choices"][0]["message"]
    assert message["content"] == "Hello STill " and message["tool_calls"][0]["function"]["name"] == "f"


def test_an_answer_carries_usage_with_cached_tokens_and_copy_statistics() -> None:
    body = whole(Call("chat", "m"), finished("abcd", "length"))
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                             "prompt_tokens_details": {"cached_tokens": 6}}
    assert body["lanes"]["tokens_by_origin"] == {"model": 2, "context": 2, "recall": 0}
    assert body["lanes"]["rows"]["context"] == {"tested": 3, "accepted": 2}
    assert body["choices"][0]["finish_reason"] == "length"
    assert json.dumps(body)


def test_engine_failures_map_to_statuses() -> None:
    assert engine_error("PromptTooLongError", "x").status == 400
    assert engine_error("MemoryLimitError", "x").status == 503
    assert engine_error("ValueError", "boom").body() == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": "engine_error"}}


def test_saved_requests_become_conversations(tmp_path) -> None:
    from engine.service.api_saving import saver
    from engine.store.store import Store

    store = Store.open(tmp_path)
    try:
        request = Request(messages=({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                                    {"role": "tool", "content": "42"}), max_tokens=9)
        saver("m")(store, request, finished("Hello"))
        [summary] = store.list_conversations()
        conv = store.conversation(summary.id)
        assert conv.system_prompt == "Be brief." and conv.title == "Hi there"
        assert [(m.role, m.content) for m in store.messages(conv.id)] == [
            ("user", "Hi there"), ("user", "[tool] 42"), ("assistant", "Hello")]
        assert store.messages(conv.id)[-1].stats["generated"] == 4
    finally:
        store.close()
