"""Sampling on the device: each row drawn with its position's key (``engine.rounds.sampling``), so
copies keep the distribution of plain sampling (statistical tests) and a seeded reply is the same
with copies or without."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import apply_top_p

from engine.drafts.verification import verify
from engine.rounds.sampling import Rows, draw_all, position_keys, sample_rows, with_draws

V = 5
P0 = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
# Row-1 distribution given the first token a (a Markov chain stands in for the model).
P1 = np.array(
    [
        [0.1, 0.6, 0.1, 0.1, 0.1],
        [0.3, 0.3, 0.2, 0.1, 0.1],
        [0.05, 0.05, 0.8, 0.05, 0.05],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.5, 0.1, 0.1, 0.1, 0.2],
    ]
)
N = 40_000
CRITICAL_24 = 51.2  # chi-square, 24 degrees of freedom: exceeded with probability 0.1%


def reference_probs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """What mlx-lm's sampler draws from for one row: ``apply_top_p`` on the log-probabilities, then
    the temperature on what is kept."""
    z = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    if top_p < 1.0:
        z = np.array(apply_top_p(mx.array(z, dtype=mx.float32), top_p), dtype=np.float64)
    scaled = np.exp((z - z.max()) / temperature)
    return scaled / scaled.sum()


def draws_at(probs: np.ndarray, keys: mx.array) -> np.ndarray:
    """One draw per key from rows ``probs`` [N, V] (temperature 1, no top-p)."""
    return np.array(sample_rows(mx.array(np.log(probs), dtype=mx.float32), keys, 1.0, 1.0))


def two_tokens(drafts: list[int], keys: mx.array, fresh_redraw: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The first two tokens of N replies (keys [N, 3, 2]: each reply's keys for positions 0..2) whose
    first round verifies ``drafts`` (two copied tokens), the way the engine does: every row drawn
    at its position, drafts kept while they equal the draws, the next round (after a rejection at
    position 0) drawing position 1 afresh. ``fresh_redraw`` breaks the coupling the way a careless
    verifier would: after a rejection it draws the emitted token again with another key, so from p
    instead of the residual."""
    x0 = draws_at(np.broadcast_to(P0, (N, V)), keys[:, 0])
    x1 = draws_at(np.broadcast_to(P1[drafts[0]], (N, V)), keys[:, 1])
    if fresh_redraw:
        x0 = np.where(x0 == drafts[0], x0, draws_at(np.broadcast_to(P0, (N, V)), keys[:, 2]))
    first, second = np.empty(N, dtype=int), np.empty(N, dtype=int)
    after = draws_at(P1[x0], keys[:, 1])  # the next round's draw where the copy broke at once
    for t in range(N):
        accepted, nxt = verify([int(x0[t]), int(x1[t]), 0], drafts)
        out = [*drafts[:accepted], nxt] if accepted < 2 else drafts
        first[t], second[t] = out[0], out[1] if len(out) > 1 else int(after[t])
    return first, second


def chi2(first: np.ndarray, second: np.ndarray) -> float:
    counts = np.zeros((V, V))
    np.add.at(counts, (first, second), 1)
    expected = N * P0[:, None] * P1
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("drafts", [[1, 1], [0, 1], [4, 4], [2, 2]])
def test_copies_keep_the_joint_distribution_of_plain_sampling(drafts: list[int]) -> None:
    keys = position_keys(1234 + drafts[0], 3 * N).reshape(N, 3, 2)
    first, second = two_tokens(drafts, keys)
    assert chi2(first, second) < CRITICAL_24
    # Coupled: each reply is exactly what plain sampling with the same keys emits.
    plain0 = draws_at(np.broadcast_to(P0, (N, V)), keys[:, 0])
    assert (first == plain0).all() and (second == draws_at(P1[plain0], keys[:, 1])).all()


def test_the_check_catches_a_verifier_that_redraws_from_p() -> None:
    keys = position_keys(7, 3 * N).reshape(N, 3, 2)
    assert chi2(*two_tokens([1, 1], keys, fresh_redraw=True)) > CRITICAL_24


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.5, 0.85), (0.7, 0.5), (1.5, 0.9)])
def test_draws_follow_mlx_lms_top_p_then_temperature(temperature: float, top_p: float) -> None:
    """The worked example's row (0.5, 0.3, 0.15, 0.05) and a random one of 50 tokens, drawn 40,000
    times: the counts fit mlx-lm's distribution (top-p 0.85 then temperature 0.5 gives 0.690,
    0.248, 0.062 and 0)."""
    rng = np.random.default_rng(3)
    for logits in (np.log(np.array([0.5, 0.3, 0.15, 0.05])), rng.normal(0, 2, size=50)):
        p = reference_probs(logits, temperature, top_p)
        rows = mx.broadcast_to(mx.array(logits, dtype=mx.float32), (N, logits.size))
        counts = np.bincount(np.array(sample_rows(rows, position_keys(11, N), temperature, top_p)),
                             minlength=logits.size)
        assert (counts[p == 0] == 0).all()  # top-p's cut tokens are never drawn
        cells = p * N >= 5
        rest = N * p[~cells & (p > 0)].sum()
        stat = float(((counts[cells] - N * p[cells]) ** 2 / (N * p[cells])).sum())
        if rest >= 5:
            stat += (counts[~cells].sum() - rest) ** 2 / rest
        df = int(cells.sum()) - (0 if rest >= 5 else 1)
        assert stat < chi2_critical(max(df, 1)), f"chi2={stat:.1f} df={df} for {logits.size} tokens"
    assert reference_probs(np.log(np.array([0.5, 0.3, 0.15, 0.05])), 0.5, 0.85) == pytest.approx(
        [0.25 / 0.3625, 0.09 / 0.3625, 0.0225 / 0.3625, 0.0])


def draw(keys: mx.array, logits: mx.array, position: int, temperature: float, top_p: float) -> mx.array:
    """One stream's draws, alone in its round."""
    return draw_all({0: Rows(keys, logits, position, temperature, top_p)})[0]


def test_a_rows_draw_depends_on_its_position_alone() -> None:
    """Three rows at positions 40..42 draw what the same rows draw one at a time, or two with other
    rows beside them; rows past the last key (padding) reuse it."""
    keys = position_keys(5, 44)
    logits = mx.array(np.random.default_rng(0).normal(0, 1, size=(3, 200)), dtype=mx.float32)
    three = draw(keys, logits, 40, 0.9, 0.95).tolist()
    ones = [draw(keys, logits[j : j + 1], 40 + j, 0.9, 0.95).item() for j in range(3)]
    assert three == ones == draw(keys, logits[:2], 40, 0.9, 0.95).tolist() + draw(keys, logits[2:], 42, 0.9, 0.95).tolist()
    padded = mx.concatenate([logits[:2], logits[1:2]])  # positions 42, 43 and a padding row past key 43
    assert draw(keys, padded, 42, 0.9, 0.95).tolist()[1:] == [draw(keys, logits[1:2], 43, 0.9, 0.95).item()] * 2
    # A position still on the device (a round run ahead after a drafting one) draws the same.
    assert draw(keys, logits, mx.array(40), 0.9, 0.95).tolist() == three
    assert draw(keys, padded, mx.array(42), 0.9, 0.95).tolist() == draw(keys, padded, 42, 0.9, 0.95).tolist()


def test_streams_that_sample_alike_draw_in_one_call_what_each_draws_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round's sampling streams share one ``sample_rows`` per (temperature, top-p), one vocabulary
    sort for all their rows, and each stream still draws what it draws alone."""
    import engine.rounds.sampling as sampling

    rng = np.random.default_rng(1)
    rows = {i: Rows(position_keys(seed, 50), mx.array(rng.normal(0, 2, size=(n, 300)), dtype=mx.float32), pos, t, p)
            for i, (seed, n, pos, t, p) in enumerate([(3, 4, 10, 0.7, 0.9), (4, 1, 20, 1.0, 1.0), (5, 2, 48, 0.7, 0.9)])}
    alone = {i: draw(*r).tolist() for i, r in rows.items()}
    calls: list[int] = []
    real = sampling.sample_rows
    monkeypatch.setattr(sampling, "sample_rows", lambda lg, *a: calls.append(lg.shape[0]) or real(lg, *a))
    together = {i: d.tolist() for i, d in draw_all(rows).items()}
    assert together == alone and sorted(calls) == [1, 6]  # streams 0 and 2 together, 4 + 2 rows


def test_new_sampling_settings_reuse_the_traced_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled (an accelerator's draws), the temperature and top-p are inputs: a reply at another
    setting reuses the trace of its shape (on a GPU a new trace builds new kernels: a stall mid-reply)."""
    import engine.rounds.sampling as sampling

    traced: list[int] = []
    real = sampling.apply_top_p  # called only while the draw is traced
    monkeypatch.setattr(sampling, "apply_top_p", lambda lp, p: traced.append(lp.shape[0]) or real(lp, p))
    logits = mx.array(np.random.default_rng(2).normal(0, 1, size=(5, 77)), dtype=mx.float32)
    keys = position_keys(8, 5)
    first = sample_rows(logits, keys, 0.7, 0.9, compiled=True)
    assert traced == [5]
    second = sample_rows(logits, keys, 1.2, 0.5, compiled=True)
    assert traced == [5] and first.shape == second.shape == (5,)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 0.9), (1.0, 1.0), (0.3, 0.5), (1.3, 0.99)])
def test_compiled_draws_are_the_draws(temperature: float, top_p: float) -> None:
    """Compiling the draw changes its kernels, not a token: 1, 3 and 8 rows of a real vocabulary's
    width draw the same either way."""
    rng = np.random.default_rng(3)
    keys = position_keys(9, 60)
    for rows in (1, 3, 8):
        logits = mx.array(rng.normal(0, 3, size=(rows, 49152)), dtype=mx.float32)
        plain = sample_rows(logits, keys[:rows], temperature, top_p)
        fused = sample_rows(logits, keys[:rows], temperature, top_p, compiled=True)
        assert plain.tolist() == fused.tolist()


def test_with_draws_replaces_a_streams_rows_and_keeps_its_padding() -> None:
    choices = mx.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    out = with_draws(choices, {1: mx.array([40, 50]), 2: mx.array([70, 80, 90])})
    assert out.tolist() == [[1, 2, 3], [40, 50, 6], [70, 80, 90]]
    assert with_draws(choices, {}) is choices
    alone = mx.array([[1, 2, 3]])
    assert with_draws(alone, {0: mx.array([40, 50, 60])}).tolist() == [[40, 50, 60]]
    assert with_draws(alone, {0: mx.array([40])}).tolist() == [[40, 2, 3]]


def test_verify_worked_example() -> None:
    assert verify([7, 8, 4, 5], [7, 8, 9]) == (2, 4)
    assert verify([7, 8, 4, 5], [7, 8, 4]) == (3, 5)
    assert verify([3], []) == (0, 3)
    assert verify([1, 2], [9]) == (0, 1)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value exceeded with probability ~0.1% (Wilson-Hilferty; ``z``: that normal quantile)."""
    h = 2 / (9 * df)
    return df * (1 - h + z * h**0.5) ** 3


@pytest.mark.model
def test_sampling_in_lanes_is_seeded_and_varied(loaded, chat_prompt) -> None:
    from engine.events import Finished, Request
    from engine.rounds.scheduler import Scheduler
    from tests import prompts

    def run(seed: int) -> tuple[int, ...]:
        events: list = []
        sched = Scheduler(loaded, events.append)
        sched.submit(Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=24,
                             temperature=0.8, top_p=0.95, seed=seed))
        while sched.busy:
            sched.step()
        done = next(e for e in events if isinstance(e, Finished))
        return done.tokens

    assert run(1) == run(1)
    assert len({run(s) for s in (1, 2, 3, 4)}) > 1


@pytest.mark.model
def test_sampled_streams_read_their_own_rows_of_a_grouped_pass(loaded, chat_prompt, monkeypatch) -> None:
    """A sampled stream in a round where another stream drafts: its logits come from its own rows
    of the grouped pass (or numpy's), so a seeded reply is what the padded pass gives (logits equal
    to float rounding), and greedy neighbours still copy."""
    from engine.drafts.cost_model import CostModel
    from engine.events import Finished, Request
    from engine.passes.choice import GENERIC
    from engine.rounds.scheduler import Scheduler
    from tests import prompts

    def run(grouped: bool, host: bool = False) -> tuple[dict[str, tuple[int, ...]], int]:
        monkeypatch.setattr(CostModel, "groups_pay", lambda self, b, w, k, keys=0: grouped and k is not None and 0 < k < b and w > 1)
        events: list = []
        passes = loaded.passes if host else replace(loaded.passes, numpy_pass=None) if grouped else GENERIC
        sched = Scheduler(replace(loaded, passes=passes), events.append)
        reqs = {"sampled": Request(prompt_tokens=tuple(chat_prompt(prompts.OPEN)), max_tokens=32,
                                   temperature=0.8, top_p=0.95, seed=7, drafts=False),
                "greedy": Request(prompt_tokens=tuple(chat_prompt(prompts.COPY)), max_tokens=32)}
        for r in reqs.values():
            sched.submit(r)
        while sched.busy:
            sched.step()
        done = {e.request_id: e.tokens for e in events if isinstance(e, Finished)}
        return {name: done[r.id] for name, r in reqs.items()}, sched.rounds_host if host else sched.rounds_grouped

    grouped, n_grouped = run(True)
    padded, n_padded = run(False)
    numpy_, n_host = run(False, host=True)  # the CPU's default: numpy's pass (engine.passes.numpy_pass)
    assert n_grouped > 0 and n_padded == 0 and n_host > 0
    assert grouped == padded == numpy_



@pytest.mark.model
def test_a_seeded_reply_is_the_same_with_copies_or_without(loaded, chat_prompt) -> None:
    """A sampled reply that copies from its prompt equals, token for token, the same seed's reply
    with copying off, alone or beside another stream, with the CPU's rounds or an accelerator's (its
    draws run ahead on the device; its copies are not continued there, while a greedy stream's
    beside it are): each position's token is drawn with that position's key."""
    from engine.events import Finished, Request, RoundStats
    from engine.passes.choice import ACCELERATOR
    from engine.rounds.scheduler import Scheduler
    from tests import prompts

    tok = loaded.tokenizer
    text = ("Lanes decodes several conversations at once and copies what it can from earlier text, "
            "without ever changing a token of what the model says.")
    repeat = [{"role": "user", "content": "Repeat this sentence: " + text}, {"role": "assistant", "content": text},
              {"role": "user", "content": "Once more, please."}]
    prompt = [*tok.apply_chat_template(repeat, add_generation_prompt=True),
              *tok.encode("Sure: Lanes decodes", add_special_tokens=False)]

    def run(drafts: bool, passes=None, beside: str = "") -> tuple[tuple[int, ...], tuple[int, int], tuple[int, int]]:
        events: list = []
        sched = Scheduler(replace(loaded, passes=passes) if passes is not None else loaded, events.append)
        req = Request(prompt_tokens=tuple(prompt), max_tokens=48, temperature=0.7, top_p=0.9, seed=11, drafts=drafts)
        sched.submit(req)
        if beside == "sampling":
            sched.submit(Request(prompt_tokens=tuple(chat_prompt(prompts.OPEN)), max_tokens=48, temperature=1.0, seed=3))
        elif beside == "greedy copying":
            sched.submit(Request(prompt_tokens=tuple(prompt), max_tokens=48))
        while sched.busy:
            sched.step()
        done = next(e for e in events if isinstance(e, Finished) and e.request_id == req.id)
        stats = [e for e in events if isinstance(e, RoundStats) and e.request_id == req.id]
        return (done.tokens, (sum(e.draft_rows for e in stats), sum(e.accepted for e in stats)),
                (sched.rounds_ahead, sched.copies_continued))

    alone, none, _ = run(drafts=False)
    copying, (drafted, landed), _ = run(drafts=True)
    assert none == (0, 0) and landed >= 3 and drafted > landed  # copies landed, and some were redrawn
    assert copying == alone
    assert run(drafts=True, beside="sampling")[0] == alone
    ahead, _, (rounds_ahead, _) = run(drafts=True, passes=ACCELERATOR, beside="sampling")
    assert rounds_ahead > 0 and ahead == alone
    # A sampling stream's copies are not continued in rounds run ahead (engine.rounds.run_ahead)...
    ahead, (_, landed), (rounds_ahead, continued) = run(drafts=True, passes=ACCELERATOR)
    assert landed >= 3 and rounds_ahead > 0 and continued == 0 and ahead == alone
    # ...but one beside a greedy stream's copy going on draws its next token at the position the
    # device computed from what its drafts kept.
    ahead, _, (_, continued) = run(drafts=True, passes=ACCELERATOR, beside="greedy copying")
    assert continued > 0 and ahead == alone


@pytest.mark.model
@pytest.mark.parametrize("seed", [1, 2])
def test_sampled_streams_beside_greedy_copies_keep_their_replies_under_adversarial_drafts(
        loaded, reference, chat_prompt, monkeypatch, seed: int) -> None:
    """Two seeded sampling streams and two greedy ones in one batch, with an accelerator's passes
    (run ahead after drafting rounds, greedy copies continued there), windows right and wrong
    granted at random to all four: the greedy streams equal mlx-lm and each sampling stream its
    seed's reply without drafts, so a sampling stream's draws after a drafting round land at the
    positions the device computed from what its drafts kept."""
    import random

    import engine.rounds.scheduler as scheduler_mod
    from engine.events import Finished, Request
    from engine.passes.choice import ACCELERATOR
    from engine.rounds.scheduler import Scheduler
    from engine.rounds.stream import Stream
    from tests import prompts
    from tests.test_fidelity import adversarial_proposer, random_allocator

    accel = replace(loaded, passes=ACCELERATOR)
    sampled = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=32, temperature=0.7, top_p=0.9, seed=seed + k)
               for k, t in enumerate((prompts.COPY, prompts.OPEN))]
    greedy = [Request(prompt_tokens=tuple(chat_prompt(t)), max_tokens=32) for t in (prompts.CODE, prompts.TYPOS)]
    refs: dict[str, list[int]] = {r.id: reference(list(r.prompt_tokens or ()), 32) for r in greedy}
    for r in sampled:
        events: list = []
        alone = Scheduler(accel, events.append)
        alone.submit(replace(r, drafts=False))
        while alone.busy:
            alone.step()
        refs[r.id] = list(next(e for e in events if isinstance(e, Finished)).tokens)

    rng = random.Random(seed)
    eos = next(iter(loaded.tokenizer.eos_token_ids))
    monkeypatch.setattr(Stream, "propose", adversarial_proposer(rng, refs, len(loaded.tokenizer), eos))
    monkeypatch.setattr(scheduler_mod, "allocate", random_allocator(rng))
    events = []
    sched = Scheduler(accel, events.append)
    for r in (*sampled, *greedy):
        sched.submit(r)
    while sched.busy:
        sched.step()
    done = {e.request_id: list(e.tokens) for e in events if isinstance(e, Finished)}
    assert sched.copies_continued > 0
    for r in (*sampled, *greedy):
        assert done[r.id] == refs[r.id], f"{'sampled' if r.temperature else 'greedy'} stream differs"


REPEAT = [
    {"role": "user", "content": "Repeat this sentence: The quick brown fox jumps over the lazy dog."},
    {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."},
    {"role": "user", "content": "Once more, please."},
]


def engine_fit(loaded, n: int = 96, k: int = 5, temperature: float = 1.0, top_p: float = 0.9) -> tuple[float, int, int]:
    """``n`` seeded replies of ``k`` tokens through the calibrated scheduler, 8 at a time, to a
    prompt whose reply goes on copying "The quick brown fox jumps over the lazy dog." from an earlier
    turn; their sequences against the exact probabilities from mlx-lm's model. Returns (chi-square,
    degrees of freedom, draft rows verified)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.events import Finished, Request, RoundStats
    from engine.rounds.scheduler import Scheduler

    tok = loaded.tokenizer
    prompt = [*tok.apply_chat_template(REPEAT, add_generation_prompt=True),
              *tok.encode("The quick brown", add_special_tokens=False)]
    events: list = []
    sched = Scheduler(loaded, events.append)
    sched.calibrate()
    for first in range(0, n, 8):
        for seed in range(first, first + 8):
            sched.submit(Request(prompt_tokens=tuple(prompt), max_tokens=k, temperature=temperature,
                                 top_p=top_p, seed=seed))
        while sched.busy:
            sched.step()
    replies = [e.tokens for e in events if isinstance(e, Finished)]
    assert len(replies) == n
    drafted = sum(e.draft_rows for e in events if isinstance(e, RoundStats))

    exact: dict[tuple[int, ...], float] = {(): 1.0}

    def probability(seq: tuple[int, ...]) -> float:
        if seq not in exact:
            logits = loaded.model(mx.array([prompt + list(seq[:-1])]), cache=make_prompt_cache(loaded.model))
            row = np.array(logits[:, -1, :].astype(mx.float32))
            exact[seq] = probability(seq[:-1]) * float(reference_probs(row[0], temperature, top_p)[seq[-1]])
        return exact[seq]

    counts: dict[tuple[int, ...], int] = {}
    for reply in replies:
        counts[reply] = counts.get(reply, 0) + 1
    # Every whole reply expected 5 times or more is a cell of its own; the rest (shorter replies too) one more.
    cells = {seq: n * probability(seq) for seq in counts if len(seq) == k}
    cells = {seq: e for seq, e in cells.items() if e >= 5}
    chi2 = sum((counts[seq] - e) ** 2 / e for seq, e in cells.items())
    rest_expected = n - sum(cells.values())
    chi2 += (n - sum(counts[seq] for seq in cells) - rest_expected) ** 2 / rest_expected
    return chi2, len(cells), drafted


@pytest.mark.model
def test_the_engine_samples_the_models_distribution_while_copying(loaded) -> None:
    """Whole replies through the scheduler with copies, temperature and top-p: copied rows are
    verified, some rejected and redrawn from the residual, and the replies still follow the model
    (chi-square 0.1 against 11.2 when written; the biased verifier below gave 24.8)."""
    chi2, df, drafted = engine_fit(loaded)
    assert drafted > 96 and df >= 1
    assert chi2 < chi2_critical(df), f"chi2={chi2:.1f} with {df} degrees of freedom"


@pytest.mark.model
def test_the_engine_check_catches_a_verifier_that_keeps_every_copy(loaded, monkeypatch) -> None:
    """The same check with a verifier that keeps every copied row whatever was drawn there (so copies
    land too often): the fit fails, so the test above can."""
    import engine.rounds.scheduler as scheduler

    monkeypatch.setattr(scheduler, "verify", lambda choices, drafts: (len(drafts), int(choices[len(drafts)])))
    chi2, df, _ = engine_fit(loaded)
    assert chi2 > chi2_critical(df)
