"""SCBench scorers: the official ones (bugs included, for comparability) and the revised ones of the paper (App. A).

Official behaviour (``scbench/compute_scores.py``, ``eval_utils.get_ground_truth``): only ``qa_eng`` labels are
wrapped in a list; every other label stays a raw string, so scorers that iterate over references iterate over its
characters. The revision normalises every label to ``list[str]``, scores ``qa_chn`` with the full-reference
character F1 and parses ``choice_eng`` options explicitly.
"""

from __future__ import annotations

import re
import string
from collections import Counter

# ---- shared helpers -----------------------------------------------------------------------------------


def as_list(label) -> list[str]:
    return [str(x) for x in label] if isinstance(label, (list, tuple)) else [str(label)]


_ZH_PUNCT = ("！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠"
             "｢｣､、〃《》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏.")


def normalize_zh(text: str) -> str:
    """Lower case, drop punctuation (ASCII and CJK) and whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation) | set(_ZH_PUNCT))
    return "".join(text.split())


def char_f1(prediction: str, reference: str) -> float:
    pred, ref = list(normalize_zh(prediction)), list(normalize_zh(reference))
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def rouge_lsum(prediction: str, reference: str) -> float:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
    return scorer.score(reference, prediction)["rougeLsum"].fmeasure


def first_int(text: str) -> int | None:
    match = re.search(r"-?\d+", text)
    return int(match.group()) if match else None


def code_block(text: str) -> str:
    """The first fenced code block, or the whole text when there is none."""
    match = re.search(r"```[a-zA-Z0-9_+-]*\n(.*?)```", text, re.S)
    return match.group(1) if match else text


def bleu(prediction: str, reference: str) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    return sentence_bleu([reference.split()], prediction.split(), smoothing_function=SmoothingFunction().method4)


# ---- official scorers -----------------------------------------------------------------------------------


def official_substring(prediction: str, label) -> float:
    """kv / prefix_suffix: ``label in pred`` (case-sensitive)."""
    return float(str(label) in prediction)


def official_any_upper(prediction: str, label) -> float:
    """qa_eng / many_shot: any label, upper-cased, in the upper-cased prediction; a raw string label is iterated
    character by character (the official bug for many_shot)."""
    labels = label if isinstance(label, (list, tuple)) else str(label)
    return float(any(str(gold).upper() in prediction.upper() for gold in labels))


def official_qa_chn(prediction: str, label) -> float:
    """qa_chn: char F1 maxed over ``for ground_truth in ground_truths`` — over the characters of a string label."""
    labels = label if isinstance(label, (list, tuple)) else str(label)
    return max(char_f1(prediction, str(gold)) for gold in labels)


def official_choice(prediction: str, label) -> float:
    """choice_eng: label is ``[option_text, letter]``; a prediction starting with A–D is judged by that character,
    any other by whether it contains the option text (so "**B**" scores 0, as the reference runs showed)."""
    prediction = prediction.strip()
    if prediction and prediction[0] in "ABCD":
        return float(prediction[0] in label)
    return float(str(as_list(label)[0]) in prediction)


def official_math_find(prediction: str, label) -> float:
    return float(first_int(prediction) == int(label))


def official_vt(prediction: str, label) -> float:
    """string_match_all over ``label`` as given: a raw string label is iterated character by character."""
    refs = label if isinstance(label, (list, tuple)) else str(label)
    return sum(str(r).lower() in prediction.lower() for r in refs) / len(refs)


def official_repoqa(prediction: str, label, candidates: list[str] | None = None, threshold: float = 0.8) -> float:
    """pass@1@0.8: the first code block's best BLEU match among the repository's functions must be the target and
    reach the threshold. (Official code extracts the function with tree-sitter; here the whole block is used.)"""
    block = code_block(prediction)
    pool = candidates or [str(label)]
    scores = [bleu(block, c) for c in pool]
    best = max(range(len(pool)), key=scores.__getitem__)
    return float(pool[best] == str(label) and scores[best] >= threshold)


# ---- revised scorers (paper App. A) ---------------------------------------------------------------------

_OPTION = re.compile(
    r"(?:answer\s*(?:is)?\s*[:：]?\s*\(?([ABCD])\)?\b)|(?:option\s+\(?([ABCD])\)?\b)|(?:^\(?([ABCD])\)?(?:[.:)\s]|$))",
    re.I | re.M,
)


def parse_option(prediction: str, options: list[str] | None = None) -> str | None:
    """The explicitly chosen option letter: ``B``, ``B.``, ``(B)``, ``Option B``, ``Answer: B``, or an option's full
    text; ``None`` when unresolved (e.g. "Based on the text ...")."""
    text = prediction.strip()
    match = _OPTION.search(text)
    if match:
        return next(g for g in match.groups() if g).upper()
    for letter, option in zip("ABCD", options or []):
        if option and option.strip() and option.strip().lower() in text.lower():
            return letter
    return None


def revised_choice(prediction: str, label, options: list[str] | None = None) -> float:
    letter = next((str(gold).strip() for gold in as_list(label) if str(gold).strip() in ("A", "B", "C", "D")), None)
    return float(letter is not None and parse_option(prediction, options) == letter)


def revised_qa_chn(prediction: str, label) -> float:
    return max(char_f1(prediction, ref) for ref in as_list(label))


def revised_any_upper(prediction: str, label) -> float:
    return float(any(ref.upper() in prediction.upper() for ref in as_list(label)))


def revised_vt(prediction: str, label) -> float:
    """string_match_all over the variable names (a string label holds them separated by spaces or commas)."""
    refs = as_list(label) if isinstance(label, (list, tuple)) else re.split(r"[\s,]+", str(label).strip())
    return sum(r.lower() in prediction.lower() for r in refs) / len(refs)


def score(task: str, prediction: str, label, options=None, candidates=None, revised: bool = True) -> float:
    """One SCBench answer, by task (sub-task names for the mixed tasks: ``summary``, ``passkey``, ``repoqa``,
    ``kv``)."""
    if task in ("kv", "prefix_suffix"):
        return official_substring(prediction, label)
    if task == "vt":
        return (revised_vt if revised else official_vt)(prediction, label)
    if task in ("qa_eng", "many_shot"):
        return (revised_any_upper if revised else official_any_upper)(prediction, label)
    if task == "qa_chn":
        return (revised_qa_chn if revised else official_qa_chn)(prediction, label)
    if task == "choice_eng":
        return revised_choice(prediction, label, options) if revised else official_choice(prediction, label)
    if task == "mf":
        return official_math_find(prediction, label)
    if task == "summary":
        return rouge_lsum(prediction, str(label))
    if task == "passkey":
        return float(first_int(prediction) == first_int(str(label)))
    if task == "repoqa":
        return official_repoqa(prediction, label, candidates)
    raise ValueError(f"unknown SCBench (sub-)task {task!r}")
