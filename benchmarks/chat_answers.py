"""Greedy answers of models to simple chat questions, side by side: does a distilled hybrid still answer like its
teacher? (the hybrid issue's "greedy answers to simple chat questions still sensible").

Each question is one user turn in the model's own chat template; the answer is greedy (``do_sample=False``), at
most ``--tokens`` new tokens, up to the end of the turn. The table is written as markdown, one column per model,
with the share of answers that agree with the first model's word for word beneath.

    python benchmarks/chat_answers.py --models smollm2-135m-instruct,smollm2-135m-hybrid \
        --out docs/hybrid/phase5/chat-committed.md

One thread, about 1 s per answer of 40 tokens for a 135M model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pretrained import loading

QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colours.",
    "Write one sentence about the sea.",
    "How many days are there in a week?",
    "What is 7 plus 5?",
    "Give me a word that rhymes with cat.",
    "What do bees make?",
    "Translate 'thank you' into French.",
    "What is the opposite of hot?",
    "Why do we need sleep? Answer in one sentence.",
)
"""General questions, none about the text any model here was distilled or evaluated on."""

NEW_QUESTIONS = (
    "What colour is a ripe banana?",
    "Name an animal that lives in the ocean.",
    "What is the first month of the year?",
    "How many legs does a spider have?",
    "Write a short greeting for a friend's birthday.",
    "What do you use an umbrella for?",
    "Which is bigger, an elephant or a mouse?",
    "What is 10 minus 3?",
    "Suggest a name for a pet dog.",
    "What season comes after winter?",
)
"""Ten more, written down (issue 48) before any model answered them. An answer counts as sensible when it answers
the question on topic and correctly, in words a reader would accept, without looping or echoing the question."""

SETS = {"committed": QUESTIONS, "new": NEW_QUESTIONS}


def answers(name: str, questions, max_new_tokens: int) -> list[str]:
    """The greedy answer of the model ``name`` to each question (one user turn, its chat template)."""
    model, tokenizer, _ = loading.load(name)
    out = []
    for question in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
        with torch.no_grad():
            generated = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        text = tokenizer.decode(generated[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        out.append(" ".join(text.split()))
    return out


def table(models: list[str], questions, columns: list[list[str]]) -> str:
    """Markdown: one row per question, one column per model; then the exact-agreement count with the first."""
    cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| question | " + " | ".join(f"`{m}`" for m in models) + " |", "|---" * (len(models) + 1) + "|"]
    for row, question in enumerate(questions):
        lines.append(f"| {cell(question)} | " + " | ".join(cell(column[row]) for column in columns) + " |")
    lines.append("")
    for model, column in zip(models[1:], columns[1:]):
        same = sum(a == b for a, b in zip(column, columns[0]))
        lines.append(f"- `{model}`: {same} of {len(questions)} answers word for word the same as `{models[0]}`'s.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m-instruct,smollm2-135m-hybrid",
                        help="comma-separated model names or directories; the first is the reference")
    parser.add_argument("--tokens", type=int, default=40, help="new tokens at most per answer")
    parser.add_argument("--questions", choices=sorted(SETS), default="committed",
                        help="the ten committed questions or the ten written down later")
    parser.add_argument("--out", default=None, help="markdown file to write (default: print)")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or args.tokens < 1:
        parser.error(f"--models {args.models!r} --tokens {args.tokens}: give at least one model and one token")
    torch.set_num_threads(1)
    questions = SETS[args.questions]
    columns = [answers(model, questions, args.tokens) for model in models]
    text = (f"Greedy answers, at most {args.tokens} new tokens, one user turn in each model's chat template "
            f"(`benchmarks/chat_answers.py --questions {args.questions}`).\n\n" + table(models, questions, columns))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
