"""A model whose chat template rejects a system prompt, or that has none, still chats, and says so."""

from __future__ import annotations

import dataclasses

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import PreTrainedTokenizerFast

from engine.events import Event, Finished, Notice, Request
from engine.model.chat_template import FOLDED, PLAIN, fold_system, plain
from engine.rounds.scheduler import Scheduler

NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MESSAGES = ({"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"})


def test_fold_system_and_plain_on_literal_messages() -> None:
    assert fold_system(MESSAGES) == [{"role": "user", "content": "Answer in one word.\n\nCapital of France?"}]
    assert fold_system(MESSAGES[1:]) == list(MESSAGES[1:])
    assert plain(MESSAGES) == "System: Answer in one word.\n\nUser: Capital of France?\n\nAssistant:"


def with_template(loaded, template: str | None):
    fast = PreTrainedTokenizerFast(tokenizer_object=loaded.tokenizer._tokenizer.backend_tokenizer,
                                   eos_token="<|im_end|>")
    fast.chat_template = template
    return dataclasses.replace(loaded, tokenizer=TokenizerWrapper(fast, eos_token_ids=loaded.tokenizer.eos_token_ids))


@pytest.mark.model
@pytest.mark.parametrize(("template", "notice"), [(NO_SYSTEM, FOLDED), (None, PLAIN)], ids=["no-system", "none"])
def test_a_model_without_a_usable_template_still_chats(loaded, template: str | None, notice: str) -> None:
    model = with_template(loaded, template)
    events: list[Event] = []
    sched = Scheduler(model, events.append)
    req = Request(messages=MESSAGES, max_tokens=8)
    sched.submit(req)
    while sched.busy:
        sched.step()
    assert [e.message for e in events if isinstance(e, Notice)] == [notice]
    done = next(e for e in events if isinstance(e, Finished) and e.request_id == req.id)
    assert done.stats.generated > 0
    if template is not None:
        expected = model.tokenizer.apply_chat_template(fold_system(MESSAGES), add_generation_prompt=True)
    else:
        expected = model.tokenizer.encode(plain(MESSAGES))
    assert sched.admission.render(req).tokens == list(expected)
