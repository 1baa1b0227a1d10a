"""Sampled verification keeps the distribution of plain sampling (a statistical test)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.drafts.verification import adjusted_probs, verify_greedy, verify_sampled

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


def two_tokens(drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
    """First two emitted tokens when the first round verifies ``drafts`` (length 2)."""
    rows = np.stack([P0, P1[drafts[0]], P1[drafts[1]]])
    accepted, nxt = verify_sampled(rows, drafts, rng)
    out = [*drafts[:accepted], nxt]
    if len(out) == 1:  # the next round samples plainly, conditioned on the real first token
        out.append(int(rng.choice(V, p=P1[out[0]])))
    return out[0], out[1]


@pytest.mark.parametrize("drafts", [[1, 1], [0, 1], [4, 4], [2, 2]])
def test_joint_distribution_matches_plain_sampling(drafts: list[int]) -> None:
    rng = np.random.default_rng(1234)
    n = 40_000
    counts = np.zeros((V, V))
    for _ in range(n):
        a, b = two_tokens(drafts, rng)
        counts[a, b] += 1
    expected = n * P0[:, None] * P1
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 24 degrees of freedom: the 0.1% critical value is 51.2.
    assert chi2 < 51.2, f"chi2={chi2:.1f}"


def test_the_check_catches_a_biased_sampler() -> None:
    """Drawing from p instead of the residual after a rejection over-weights the draft."""

    def naive(rows: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
        if rng.random() < rows[0][drafts[0]]:
            return 1, int(rng.choice(V, p=rows[1]))
        return 0, int(rng.choice(V, p=rows[0]))

    rng = np.random.default_rng(7)
    n = 40_000
    counts = np.zeros((V, V))
    for _ in range(n):
        rows = np.stack([P0, P1[1], P1[1]])
        accepted, nxt = naive(rows, [1, 1], rng)
        first = 1 if accepted else nxt
        second = nxt if accepted else int(rng.choice(V, p=P1[first]))
        counts[first, second] += 1
    expected = n * P0[:, None] * P1
    assert float(((counts - expected) ** 2 / expected).sum()) > 51.2


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    p = adjusted_probs(logits, temperature=1.0, top_p=0.7)
    assert np.allclose(p, [[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]])
    assert np.allclose(adjusted_probs(logits, 1.0, 1.0), [[0.5, 0.3, 0.15, 0.05]])


def test_probabilities_are_mlx_lms_top_p_then_temperature() -> None:
    """The worked example of ``adjusted_probs``, then mlx-lm's own sampler on random rows: top-p on
    the log-probabilities (``apply_top_p``), then the temperature on what is kept."""
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_top_p

    p = adjusted_probs(np.log(np.array([[0.5, 0.3, 0.15, 0.05]])), temperature=0.5, top_p=0.85)
    assert p[0] == pytest.approx([0.25 / 0.3625, 0.09 / 0.3625, 0.0225 / 0.3625, 0.0])
    rng = np.random.default_rng(3)
    for temperature in (0.3, 0.7, 1.5):
        for top_p in (0.5, 0.9):
            logits = rng.normal(0, 3, size=(1, 50))
            logprobs = logits - np.log(np.exp(logits).sum())
            kept = np.array(apply_top_p(mx.array(logprobs, dtype=mx.float32), top_p), dtype=np.float64)
            scaled = np.exp((kept - kept.max()) / temperature)
            assert adjusted_probs(logits, temperature, top_p)[0] == pytest.approx(scaled[0] / scaled.sum(), abs=1e-6)


def test_temperature_sharpens() -> None:
    logits = np.log(np.array([[0.6, 0.4]]))
    cold = adjusted_probs(logits, temperature=0.5, top_p=1.0)
    assert cold[0, 0] > 0.6 and np.isclose(cold.sum(), 1.0)


def test_greedy_rule_worked_example() -> None:
    assert verify_greedy([7, 8, 4, 5], [7, 8, 9]) == (2, 4)
    assert verify_greedy([7, 8, 4, 5], [7, 8, 4]) == (3, 5)
    assert verify_greedy([3], []) == (0, 3)
    assert verify_greedy([1, 2], [9]) == (0, 1)


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



REPEAT = [
    {"role": "user", "content": "Repeat this sentence: The quick brown fox jumps over the lazy dog."},
    {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."},
    {"role": "user", "content": "Once more, please."},
]


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value exceeded with probability ~0.1% (Wilson-Hilferty; ``z``: that normal quantile)."""
    h = 2 / (9 * df)
    return df * (1 - h + z * h**0.5) ** 3


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
            exact[seq] = probability(seq[:-1]) * float(adjusted_probs(row, temperature, top_p)[0][seq[-1]])
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
def test_the_engine_check_catches_a_verifier_that_skips_the_residual(loaded, monkeypatch) -> None:
    """The same check with a verifier that, after rejecting a copy, draws from p instead of the
    residual (so copies land too often): the fit fails, so the test above can."""
    import engine.rounds.scheduler as scheduler

    def naive(probs: np.ndarray, drafts: list[int], rng: np.random.Generator) -> tuple[int, int]:
        for i, d in enumerate(drafts):
            if rng.random() >= probs[i][d]:
                return i, int(rng.choice(len(probs[i]), p=probs[i]))
        return len(drafts), int(rng.choice(len(probs[-1]), p=probs[len(drafts)]))

    monkeypatch.setattr(scheduler, "verify_sampled", naive)
    chi2, df, _ = engine_fit(loaded)
    assert chi2 > chi2_critical(df)
