"""One reply in progress: its tokens, copy indexes, copy rates, text and stop rules."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace

import mlx.core as mx
from mlx_lm.tokenizer_utils import StreamingDetokenizer, TokenizerWrapper

from engine.drafts.copy_index import ContextIndex, RecallIndex, Window
from engine.drafts.copy_rates import CopyRates
from engine.drafts.edits import Applied, EditBook, edit_between
from engine.events import Finished, Origin, ReplyStats, Request, SourceCounts, StopReason
from engine.model.families import Family
from engine.rounds.sampling import position_keys

# A copy broken by an edit (a renamed word, a fixed typo) resumes within a few tokens; this many
# tokens after the break the reply has moved on, and a one-token match near the old spot is chance.
RESYNC_SPAN = 8


@dataclass
class Counts:
    tested: int = 0
    accepted: int = 0
    granted: int = 0


@dataclass
class Stream:
    request: Request
    prompt: list[int]
    family: Family
    tokenizer: TokenizerWrapper
    own_rates: bool
    rates: CopyRates
    context: ContextIndex
    started: float = field(default_factory=time.perf_counter)
    output: list[int] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)
    text: str = ""
    first_token_at: float | None = None
    reused: int = 0
    left_out: int = 0  # earliest messages of a chat left out to fit the context
    rounds: int = 0
    rows: dict[str, Counts] = field(default_factory=lambda: {"context": Counts(), "recall": Counts()})
    stop_reason: StopReason | None = None
    cancelled: bool = False
    keys: mx.array | None = None  # a sampling stream's key per output position (engine.rounds.sampling)
    # mlx-lm's streaming detokenizer for this tokenizer: decoding each round's tokens on their own
    # would drop SentencePiece's leading spaces (Mistral, Llama 2) at round boundaries.
    detokenizer: StreamingDetokenizer | None = None
    anchor: int = -1  # where the last context copy stood in the stream's tokens, for resync
    broke_at: int = -1  # tokens in view when that copy stopped
    anchor_landed: bool = False  # whether that copy landed rows (a real copy, not a chance match)
    edits: EditBook = field(default_factory=EditBook)  # edits this reply made to the prompt it copies
    brief: ContextIndex | None = None  # the fallback search for matches under min_match (family.brief_match)

    @classmethod
    def start(cls, request: Request, prompt: list[int], family: Family, tokenizer: TokenizerWrapper) -> Stream:
        own = family.own_copy_rates if request.own_copy_rates is None else request.own_copy_rates
        rates = CopyRates.from_snapshot(request.copy_history, prior=family.copy_rate,
                                       doubt_prior=family.doubt_prior)
        context = ContextIndex(min_match=family.min_match["context"])
        context.extend(prompt)
        brief = None
        if own and 0 < family.brief_match < context.min_match:
            brief = ContextIndex(min_match=family.brief_match, max_match=context.min_match - 1)
            brief.extend(prompt)
        keys = None
        if request.temperature > 0:  # one past max_tokens: a round's padding rows draw too, never kept
            seed = request.seed if request.seed is not None else secrets.randbits(63)
            keys = position_keys(seed, request.max_tokens + 1)
        return cls(request, prompt, family, tokenizer, own, rates, context, keys=keys, brief=brief)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def tokens_in_view(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    def tail(self, n: int) -> list[int]:
        """The last ``n`` tokens of prompt + output, without copying the whole history."""
        if len(self.output) >= n:
            return self.output[-n:]
        return self.prompt[max(0, len(self.prompt) - (n - len(self.output))) :] + self.output

    @property
    def remaining(self) -> int:
        return self.request.max_tokens - len(self.output)

    # -- drafting ------------------------------------------------------------
    def propose(self, recall: RecallIndex | None, exclude: str | None) -> Window | None:
        """The window this stream offers: the longer match wins, ties go to context."""
        if not self.request.drafts or self.remaining <= 1:
            return None
        # Twice the rows a round verifies: what a round run ahead after a drafting one continues with.
        limit = min(2 * self.family.max_window, self.remaining - 1)
        best = self._continue(limit)
        if best is None:
            best = self.context.propose(limit)
            if best is not None:
                best = self._edited(best, limit)
        if best is None and self._may_resync(0):
            best = self._resync(limit)
        if best is None and self.brief is not None:
            best = self._brief(limit)
        if recall is not None and self.request.recall and len(recall):
            other = recall.propose(self.tail(recall.max_match), limit, exclude=exclude)
            if other is not None and (best is None or other.match_len > best.match_len):
                best = other
        return best

    def _brief(self, limit: int) -> Window | None:
        """A brief match into the prompt: the reply just wrote two or three tokens that the given text
        has once (a name in a table row, an identifier in rewritten code). In the reply's own prose a
        match that brief is mostly chance, so it is not looked for there."""
        assert self.brief is not None
        found = self.brief.propose(limit, unambiguous=True)
        if found is None or found.start >= len(self.prompt):
            return None
        return self._edited(replace(found, brief=True), limit)

    def _continue(self, limit: int) -> Window | None:
        """The edited copy of the prompt picked up where the last window stopped, if the reply has
        kept to it since; only once the reply has made an edit, since an unedited copy is found by
        ``ContextIndex.propose`` as well."""
        if not self.edits or not 0 <= self.anchor < len(self.prompt) or not self._may_resync(0):
            return None
        toks = self.context.tokens
        n, done = len(toks), self.tokens_in_view - self.broke_at
        d = self.edits.apply(toks, self.anchor, n, done + limit, edit_until=len(self.prompt))
        if len(d.tokens) <= done or tuple(toks[self.broke_at : n]) != d.tokens[:done]:
            return None
        applied = tuple(Applied(a.at - done, a.old, a.length) for a in d.applied if a.at >= done)
        return Window(self.context.source, d.tokens[done:], self.context.max_match, d.sources[done],
                      sources=d.sources[done:], applied=applied)

    def _resync(self, limit: int) -> Window | None:
        """A resync window, drafted with the edit it implies: what the reply wrote in place of the
        prompt's text between the break and where the copy resumes."""
        w = self.context.resync(self.anchor, limit)
        if w is None:
            return None
        toks, k = self.context.tokens, w.match_len
        learn = None
        if (self.family.copy_edits and self.anchor < len(self.prompt) and w.start <= len(self.prompt)
                and self.anchor <= w.start - k and self.broke_at <= self.tokens_in_view - k):
            learn = edit_between(toks[self.anchor : w.start], toks[self.broke_at : self.tokens_in_view])
        return self._edited(w, limit, learn)

    def _edited(self, window: Window, limit: int,
                learn: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Window | None:
        """``window`` drafted again with this stream's edits (and ``learn``) where it copies the prompt."""
        if not (self.edits or learn) or not 0 <= window.start < len(self.prompt):
            return window
        toks = self.context.tokens
        d = self.edits.apply(toks, window.start, len(toks), limit, edit_until=len(self.prompt), extra=learn)
        if not d.tokens:
            return None
        return replace(window, tokens=d.tokens, sources=d.sources, applied=d.applied, learn=learn)

    def surely_draft_free_next(self, recall: RecallIndex | None) -> bool:
        """True when, whatever token this round adds, next round this stream can offer no window.

        Then a round may be started before this one's tokens reach the host (the scheduler's run
        ahead), since its rows do not depend on them.
        """
        if not self.request.drafts or self.remaining <= 2:  # propose needs remaining > 1 next round
            return True
        if self.context.may_propose_next() or self._may_resync(1):
            return False
        if self.brief is not None and self.brief.may_propose_next():
            return False
        if recall is not None and self.request.recall and len(recall):
            return not recall.may_propose_after(self.tail(recall.min_match))
        return True

    def _may_resync(self, ahead: int) -> bool:
        """Whether a resync window may be looked for ``ahead`` tokens from now."""
        return self.anchor >= 0 and self.tokens_in_view + ahead - self.broke_at <= RESYNC_SPAN

    def price(self, window: Window) -> tuple[float, float | None]:
        """(rate, first_rate) of ``window``'s rows for the allocator.

        With own copy rates off every row is priced at the family's fixed rate. With them on, the
        first row is priced from this stream's history of first rows (of resyncs, for a resync
        window) and the rows after it from the history of its source (engine.drafts.copy_rates).
        """
        if not self.own_rates:
            return self.family.copy_rate, None
        key = window.rate_key
        return self.rates.rest_rate(window.source, key), self.rates.first_rate(window.source, key)

    # -- after verification -------------------------------------------------
    def record_window(self, window: Window, granted: int, accepted: int) -> None:
        source = window.source
        # A brief match that broke at once is mostly chance: it does not displace a copy that landed
        # rows and broke lately (a resync or an edited copy's continuation may still pick that up).
        keep = window.brief and accepted == 0 and self.anchor_landed and self._may_resync(0)
        if source == "context" and not keep:
            kept = window.rewind(accepted)
            self.anchor = window.source_at(kept)
            self.broke_at = self.tokens_in_view + kept
            self.anchor_landed = accepted > 0
            learned = window.learn if accepted else None  # the copy resumed: the edit was real
            if learned is not None:
                self.edits.learn(*learned)
            self.edits.score([a for a in window.applied if learned is None or a.old != learned[0]],
                             granted, accepted)
        tested = self.rates.record_window(source, granted, accepted, window.rate_key)
        counts = self.rows[source]
        counts.tested += tested
        counts.granted += granted
        counts.accepted += accepted

    def accept(self, tokens: list[int], origins: list[Origin]) -> tuple[list[int], list[Origin], str]:
        """Append verified tokens, applying eos, max tokens and stop strings.

        Returns what was really emitted (tokens after a stop are dropped) and the
        new committed text.
        """
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        eos = self.tokenizer.eos_token_ids
        kept: list[int] = []
        for t in tokens:
            if t in eos:
                self.stop_reason = "eos"
                break
            kept.append(t)
            if len(self.output) + len(kept) >= self.request.max_tokens:
                self.stop_reason = "length"
                break
        kept_origins = origins[: len(kept)]
        self.output.extend(kept)
        self.origins.extend(kept_origins)
        self.context.extend(kept)
        if self.brief is not None:
            self.brief.extend(kept)
        new_text = self._commit_text(kept, final=self.stop_reason is not None)
        stop_at = self._find_stop(len(new_text))
        if stop_at is not None:
            cut = stop_at - (len(self.text) - len(new_text))
            new_text = new_text[: max(cut, 0)]
            self.text = self.text[:stop_at]
            self.stop_reason = "stop"
        return kept, kept_origins, new_text

    def _commit_text(self, tokens: list[int], final: bool) -> str:
        if self.detokenizer is None:
            self.detokenizer = self.tokenizer.detokenizer
            self.detokenizer.reset()
            if self.request.continue_final and self.prompt:
                # After the reply's own last token, so that a detokenizer that trims a reply's leading
                # space (mlx-lm's SentencePiece and byte-level ones do) keeps the space it goes on after.
                self.detokenizer.add_token(self.prompt[-1])
                if not self.detokenizer.text:  # held back (a lone space, part of a character): flushed
                    self.detokenizer.finalize()
                _ = self.detokenizer.last_segment  # the reply's text already
        for t in tokens:
            self.detokenizer.add_token(t)
        if final:
            self.detokenizer.finalize()
        piece = self.detokenizer.last_segment
        self.text += piece
        return piece

    def _find_stop(self, new_chars: int) -> int | None:
        if not self.request.stop or new_chars == 0:
            return None
        longest = max(len(s) for s in self.request.stop)
        start = max(0, len(self.text) - new_chars - longest + 1)
        hits = [i for s in self.request.stop if (i := self.text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def finished(self) -> Finished:
        """The event that ends this stream: its tokens, text, statistics and copy history."""
        stats = ReplyStats(
            prompt_tokens=len(self.prompt), generated=len(self.output), seconds=time.perf_counter() - self.started,
            first_token_s=None if self.first_token_at is None else self.first_token_at - self.started,
            prefill_reused=self.reused, rounds=self.rounds, rows=self.source_counts(), left_out=self.left_out)
        return Finished(self.id, self.stop_reason or "length", tuple(self.output), tuple(self.origins), self.text,
                        stats, self.rates.snapshot())

    @property
    def copied(self) -> int:
        """Draft rows this reply has landed so far, from either source."""
        return sum(c.accepted for c in self.rows.values())

    def source_counts(self) -> dict[str, SourceCounts]:
        return {k: SourceCounts(v.tested, v.accepted, v.granted) for k, v in self.rows.items()}
