"""RULER generators: deterministic under a seed, answerable, the right structure and length."""

import pytest

from workloads.tasks import PROFILES, TASKS, Config, generate
from workloads.tasks.ruler import NIAH


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("task", TASKS)
def test_deterministic_answerable_and_fitted(task, profile):
    # faithful wording is long; in bytes (our count here) cwe's 60 numbered words need more than 1024
    length = 1024 if profile == "compact" else 2048
    cfg = Config(profile=profile, length=length)
    item = generate(task, 3, 7, cfg)
    again = generate(task, 3, 7, cfg)
    assert (item.context, [q.prompt for q in item.questions]) == (again.context, [q.prompt for q in again.questions])
    assert generate(task, 4, 7, cfg).context != item.context
    assert generate(task, 3, 8, cfg).context != item.context
    assert item.questions
    for question in item.questions:
        for answer in question.answers:
            assert answer in item.body  # the answer text is present in the context
        assert question.prompt not in item.context
        assert len(item.context) + len(question.prompt) + question.max_new_tokens <= length
    longest = max(len(q.prompt) + q.max_new_tokens for q in item.questions)
    assert len(item.context) + longest > 0.8 * length  # the haystack was grown to the target
    assert item.context.startswith(item.protected_text)


def test_a_length_past_what_the_haystack_can_fill_is_refused_not_looped_on():
    """cwe draws its other words without repeats from a fixed pool: past about 139,000 bytes (compact) its haystack
    stops growing, and the search for the largest fitting haystack once doubled for ever."""
    from runtime.errors import UsageError

    with pytest.raises(UsageError, match=r"length 1000000 is more than this task's haystack can fill: it stops "
                                         r"growing at about \d+ tokens"):
        generate("cwe", 0, 0, Config(profile="compact", length=1_000_000))
    assert generate("fwe", 0, 0, Config(profile="compact", length=8192)).context  # a task that grows is untouched


def test_niah_structure_follows_ruler():
    cfg = Config(profile="faithful", length=4096)
    multikey = generate("niah_multikey_1", 0, 0, cfg)
    assert multikey.body.count("One of the special magic numbers for") == 4
    assert len(multikey.questions) == 4  # every needle key is asked in turn
    multivalue = generate("niah_multivalue", 0, 0, cfg)
    assert len(multivalue.questions[0].answers) == 4
    multiquery = generate("niah_multiquery", 0, 0, cfg)
    assert ", and " in multiquery.questions[0].text and len(multiquery.questions[0].answers) == 4
    distractors = generate("niah_multikey_2", 0, 0, cfg)
    assert distractors.body.count("One of the special magic numbers for") > 20
    single = generate("niah_single_1", 0, 0, cfg)
    assert "A special magic number" not in single.body and " is: " in single.body
    assert (NIAH["niah_single_3"][2] == "uuids"
            and len(generate("niah_single_3", 0, 0, cfg).questions[0].answers[0]) == 36)


def test_length_counts_with_the_given_tokenizer():
    words = lambda text: len(text.split())  # noqa: E731  a coarse "tokenizer": fits far more text
    item = generate("niah_single_2", 0, 0, Config(length=300, count_tokens=words))
    assert words(item.context) + words(item.questions[0].prompt) + 24 <= 300 < len(item.context)


def test_user_essay_and_qa_documents():
    essay = "Alpha beta gamma. Delta epsilon zeta! Eta theta iota? Kappa lambda mu."
    item = generate("niah_single_2", 0, 0, Config(length=512, essay=essay))
    assert "Delta epsilon zeta!" in item.body
    rows = [{"context": f"Paragraph {i} says the code is K{i}.", "question": f"What code does paragraph {i} give?",
             "answers": [f"K{i}"]} for i in range(30)]
    qa = generate("qa_1", 0, 0, Config(length=1024, qa_documents=rows))
    assert qa.questions[0].answers[0] in qa.body and "Document 1:" in qa.body


def test_bad_task_and_profile():
    with pytest.raises(ValueError, match="unknown RULER task 'niah_9'"):
        generate("niah_9", 0)
    with pytest.raises(ValueError, match="unknown template profile 'tiny'"):
        generate("vt", 0, 0, Config(profile="tiny"))
    with pytest.raises(ValueError, match="too short"):
        generate("qa_2", 0, 0, Config(length=40))


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_1", "vt"])
def test_a_length_too_short_names_about_the_least_that_fits(task):
    """The refusal says about how many tokens one haystack unit needs (the words drawn depend on the length, so the
    least length is not one number), and a little more is enough."""
    import re

    with pytest.raises(ValueError, match="too short") as refused:
        generate(task, 0, 0, Config(length=60))
    about = int(re.search(r"it needs about (\d+) tokens", str(refused.value)).group(1))
    assert about > 60 and generate(task, 0, 0, Config(length=about + 64)).questions
