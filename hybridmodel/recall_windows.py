"""Associative-recall windows for distillation (:mod:`hybridmodel.distill`, ``recall_fraction``): everyday facts —
settings, definitions, identifiers, addresses, dates, people and roles, product codes, phone extensions, version
numbers, rooms — with keys and values drawn at random, set as lines at random depths of training-source text, then
asked back at the end of a ChatML conversation and answered, the answers teacher-forced.

A window is plain token ids: distillation matches the teacher's next-token distribution at every position, so
where the reply states a value the hybrid is taught to put its probability where the teacher puts it — which the
teacher does by finding the fact in the text. The answers are right by construction, so the teacher's logits there
are those of a model that retrieved; the text around the facts keeps the rest of the window ordinary.

Variety, so that what is learnt is recall and not one layout: ten formats with several phrasings each for the
fact, the question and the reply; two to five facts in 2,048 tokens, up to eleven in 4,096, of one format (keys
to tell apart) or several; one question, several in one turn (a numbered reply) or several turns; the asked facts
drawn among all, the last one inserted no more often than any other; an opening instruction or none. The facts and
every phrasing: :mod:`hybridmodel.recall_facts`.

What it reads: the token documents of a :class:`hybridmodel.distill_windows.Windows` of the ``train`` split of
:data:`workloads.corpus.SOURCES` (text and the vocabulary of invented names both), nothing else; and its wording is
its own — ``tests/model/test_recall_windows.py`` checks it against every template of the benchmark tasks of
:mod:`workloads.tasks`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from runtime import CHATML_ASSISTANT_TURN, encode_text
from runtime.errors import UsageError

from .recall_facts import FORMATS, JOINT, LEADS, OPENINGS, Fact, vocabulary

USER_TURN = "<|im_start|>user\n"
END_TURN = "<|im_end|>\n"


@dataclass(frozen=True)
class RecallWindow:
    """A window and where its parts stand.

    Attributes
    ----------
    ids : torch.Tensor
        ``[1, length]`` token ids.
    facts : tuple[Fact, ...]
        In the order they stand in the text.
    text_span : tuple[int, int]
        ``(start, end)`` of the user's text (training text and facts), after the turn's opening, before the questions.
    fact_spans : tuple[tuple[int, int], ...]
        ``(start, end)`` of each fact's line in ``ids``.
    asked : tuple[int, ...]
        Index into ``facts`` of each question, in the order asked.
    question_spans, value_spans : tuple[tuple[int, int], ...]
        Per question: ``(start, end)`` of its text, and of the value its reply states (teacher-forced).
    reply_starts : tuple[int, ...]
        Per assistant turn: the position of its first token, right after the assistant's turn header.
    """

    ids: torch.Tensor
    facts: tuple[Fact, ...]
    text_span: tuple[int, int]
    fact_spans: tuple[tuple[int, int], ...]
    asked: tuple[int, ...]
    question_spans: tuple[tuple[int, int], ...]
    value_spans: tuple[tuple[int, int], ...]
    reply_starts: tuple[int, ...]


class RecallWindows:
    """Recall windows of any length from the documents of a :class:`hybridmodel.distill_windows.Windows` of the
    training split; the window of ``(step, length)`` depends on ``(seed, step, length)`` only.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast
        With ChatML's ``<|im_start|>`` and ``<|im_end|>``.
    plain : Windows
        Its ``docs`` (token ids of the training split) are the text and the vocabulary.
    seed : int
    """

    def __init__(self, tokenizer, plain, seed: int):
        if plain.split != "train":
            raise UsageError(f"recall windows are made of training text only, not of the {plain.split!r} split")
        self.tokenizer, self.docs, self.seed = tokenizer, plain.docs, seed
        self.words = vocabulary(self.docs, tokenizer)
        self.paragraph = encode_text(tokenizer, "\n\n")
        self._breaks: dict[int, bool] = {}

    def _breaks_line(self, token: int) -> bool:
        """Whether ``token``'s text holds a line break (code's may go on with the next line's indentation)."""
        if token not in self._breaks:
            self._breaks[token] = "\n" in self.tokenizer.decode([token])
        return self._breaks[token]

    def _facts(self, rng: random.Random, count: int) -> list[Fact]:
        kinds = [rng.choice(list(FORMATS))] * count if rng.random() < 0.4 else rng.choices(list(FORMATS), k=count)
        facts: list[Fact] = []
        keys, values = set(), set()
        for kind in kinds:
            spec = FORMATS[kind]
            key, value = spec.key(rng, self.words), spec.value(rng, self.words)
            # a key unique in the window (and no key inside another), a value no other fact states
            while any(key in k or k in key for k in keys) or value in values:
                key, value = spec.key(rng, self.words), spec.value(rng, self.words)
            keys.add(key)
            values.add(value)
            facts.append(Fact(kind, key, value, rng.choice(spec.facts).format(k=key, v=value)))
        return facts

    def _reply(self, rng: random.Random, fact: Fact) -> tuple[str, str]:
        """``(before, after)`` the value of ``fact`` in a reply stating it (``before`` ends with a space unless
        empty)."""
        before, after = rng.choice(FORMATS[fact.kind].replies).split("{v}")
        return before.format(k=fact.key), after.format(k=fact.key)

    def _question(self, rng: random.Random, fact: Fact) -> str:
        return rng.choice(LEADS) + rng.choice(FORMATS[fact.kind].questions).format(k=fact.key)

    def _end(self, rng: random.Random, facts: list[Fact], asked: list[int]) -> list[tuple[str, str]]:
        """The window's end as ``(text, role)`` pieces, ``role`` one of ``question``, ``value``, ``header`` (the
        assistant's turn header) and ``frame``: one question; several in one turn, answered by a numbered reply; or
        several turns."""
        pieces: list[tuple[str, str]] = [("\n\n", "frame")]
        if len(asked) > 1 and rng.random() < 0.5:
            pieces.append((rng.choice(JOINT), "frame"))
            for number, index in enumerate(asked, 1):
                pieces += [(f"\n{number}. ", "frame"), (self._question(rng, facts[index]), "question")]
            pieces.append((CHATML_ASSISTANT_TURN, "header"))
            for number, index in enumerate(asked, 1):
                before, after = self._reply(rng, facts[index])
                pieces += [(("\n" if number > 1 else "") + f"{number}. {before}", "frame"),
                           (facts[index].value, "value"), (after, "frame")]
            return pieces + [(END_TURN, "frame")]
        for turn, index in enumerate(asked):
            before, after = self._reply(rng, facts[index])
            pieces += [(USER_TURN if turn else "", "frame"), (self._question(rng, facts[index]), "question"),
                       (CHATML_ASSISTANT_TURN, "header"), (before, "frame"), (facts[index].value, "value"),
                       (after, "frame"), (END_TURN, "frame")]
        return pieces

    def _encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` (no special tokens added) and each token's character span."""
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return encoded["input_ids"], encoded["offset_mapping"]

    def _text(self, rng: random.Random, count: int) -> list[int]:
        """``count`` tokens of training documents, each from a line's start, joined by a blank line."""
        ids: list[int] = []
        while len(ids) < count:
            doc = rng.choice(self.docs)
            start = rng.randrange(max(1, len(doc) - (count - len(ids))))
            while 0 < start < len(doc) and not self._breaks_line(doc[start - 1]):
                start += 1
            ids += (self.paragraph if ids else []) + doc[start:start + count - len(ids)]
        return ids[:count]

    def __call__(self, step: int, length: int) -> RecallWindow:
        """The window of ``step``, ``length`` tokens: ``<|im_start|>user``, an opening or none, training text with
        the facts as lines at random depths, the questions and the teacher-forced replies (the last token ends
        the last reply's turn). The user's turn is encoded as one text and so is the end, as the teacher's
        tokenizer encodes them whole."""
        rng = random.Random(f"recall:{self.seed}:{step}:{length}")
        count = rng.randint(2, max(3, length // 350))
        for _ in range(8):  # texts that name a key are drawn again, eight times at most
            for _ in range(16):  # facts, questions and frame take half the window at most: fewer facts until they do
                facts = self._facts(rng, count)
                asked = rng.sample(range(count), 1 if rng.random() < 0.5 else rng.randint(1, min(4, count)))
                opening = USER_TURN + (rng.choice(OPENINGS) + "\n\n" if rng.random() < 0.6 else "")
                pieces = self._end(rng, facts, asked)
                end, end_offsets = self._encode("".join(text for text, _ in pieces))
                lines = sum(len(encode_text(self.tokenizer, fact.text + "\n")) for fact in facts)
                used = len(encode_text(self.tokenizer, opening)) + lines + len(end)
                if used <= length // 2:
                    break
                count = max(2, count - 1)
            else:
                raise UsageError(f"length {length}: too short for a recall window (two facts, their questions and "
                                 f"replies take {used} tokens)")
            # text to spare: encoded with the facts in it, the text may take a few tokens more or fewer
            spare = 16 + 4 * len(facts)
            body = self._text(rng, length - used + spare)
            text = self.tokenizer.decode(body)
            if not any(fact.key in text for fact in facts):  # a key the text names too would make two answers
                break
        # each fact a line of its own, at a line start of the text before the spare tokens (in text without line
        # breaks: after a space, opening a line)
        reach = len(self.tokenizer.decode(body[:length - used - spare]))
        starts = [i for i in range(reach + 1) if i == 0 or text[i - 1] == "\n"]
        opener = ""
        if len(starts) == 1:
            starts, opener = [i for i in range(1, reach + 1) if text[i - 1] == " "] or [0], "\n"
        depths = sorted(rng.choice(starts) for _ in facts)
        order = list(range(len(facts)))
        rng.shuffle(order)  # which fact stands where: the first inserted is not the first asked
        user, chars, cursor = opening, [(0, 0)] * len(facts), 0
        for depth, index in zip(depths, order):
            user += text[cursor:depth] + opener
            cursor = depth
            chars[index] = (len(user), len(user) + len(facts[index].text))
            user += facts[index].text + "\n"
        user += text[cursor:]
        ids, offsets = self._encode(user)
        ids, offsets = ids[:length - len(end)], offsets[:length - len(end)]

        def tokens(span: tuple[int, int], offsets: list[tuple[int, int]], shift: int = 0) -> tuple[int, int]:
            """The tokens that overlap the characters ``span``: ``(first, last + 1)``, shifted by ``shift``."""
            inside = [k for k, (a, b) in enumerate(offsets) if a < span[1] and b > span[0]]
            return inside[0] + shift, inside[-1] + 1 + shift

        spans = [tokens(span, offsets) for span in chars]
        assert len(ids) == length - len(end) and max(stop for _, stop in spans) < len(ids), "too little spare text"
        text_span = (next(k for k, (_, b) in enumerate(offsets) if b > len(opening)), len(ids))
        placed = sorted(range(len(facts)), key=lambda i: chars[i][0])  # the facts in the order the text has them
        rank = {index: position for position, index in enumerate(placed)}
        questions, values, replies, at = [], [], [], 0
        for piece, role in pieces:
            if role in ("question", "value"):
                (questions if role == "question" else values).append(tokens((at, at + len(piece)), end_offsets,
                                                                            len(ids)))
            at += len(piece)
            if role == "header":
                replies.append(len(ids) + sum(1 for _, b in end_offsets if b <= at))
        ids += end
        assert len(ids) == length, f"a recall window of {len(ids)} tokens, not {length}"
        return RecallWindow(torch.tensor(ids).unsqueeze(0), tuple(facts[i] for i in placed), text_span,
                            tuple(spans[i] for i in placed), tuple(rank[i] for i in asked), tuple(questions),
                            tuple(values), tuple(replies))
