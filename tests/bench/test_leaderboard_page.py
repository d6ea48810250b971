"""``leaderboard.html``: one self-contained page that shows the leaderboard's own numbers, rebuilt to the byte, checked
by ``bench verify --docs`` like the Markdown, and drawn as its data says in a real (headless) Chromium."""

import json
import re
import shutil
import tempfile

import numpy as np
import pytest

from bench.reports.leaderboard import MANIFEST, read_manifest, sha256_of, write_leaderboard
from bench.reports.leaderboard_page import ALL_TASKS, PAGE, group_data, page_html
from bench.reports.paper_tables import table3_markdown, table4_markdown
from bench.reports.report import METRICS, GroupReport, group_rows, group_title
from bench.reports.verify import DIFF_WIDTH, verify_stores
from bench.run.compare import run_compare
from runtime.errors import UsageError
from tests.helpers import compare_settings, run_cli

FRACTIONS = (0.1, 0.4, 0.7)
METHODS = {"none/none": 0.0, "gatesight/gate": 0.3, "kvzip/global": 0.2, "gatesight/flat": 0.1,
           "gatesight/pyramid": 0.25, "snapkv/flat": -0.2}


def _rows(length: int, methods: dict[str, float], items: int = 12, fractions=FRACTIONS) -> list[dict]:
    """One setting group (told apart by ``length``): every method at every fraction on two tasks and two haystacks;
    an item's value is its base plus the method's shift scaled by p, so the curves rise with p and differ, plus an
    offset of its task's (each task's own curve is another)."""
    base = np.random.default_rng(length).uniform(0.2, 0.5, size=items)
    rows = []
    for h, haystack in enumerate(("generated", "manpages")):
        for t, task in enumerate(("niah_single_1", "niah_multikey_1")):
            for method, shift in methods.items():
                press, alloc = method.split("/")
                for p in (1.0,) if press == "none" else fractions:
                    for item, b in enumerate(base):
                        value = b + shift * p + 0.05 * ((item * 7 + len(method)) % 3) + 0.1 * t - 0.07 * h
                        rows.append({"model": "m", "weights": "w", "profile": "compact", "length": length,
                                     "code": "c", "press": press, "allocator": alloc, "keep_fraction": p,
                                     "task": task, "haystack": haystack, "item": item, "question": 0,
                                     "score": min(value, 1.0), "delta_nll": 0.0 if press == "none" else 1 - value})
    return rows


ROWS = _rows(2048, METHODS) + _rows(4096, {m: s for m, s in METHODS.items() if m in ("none/none", "snapkv/flat",
                                                                                     "kvzip/global")})


def _page(rows: list[dict], resamples: int = 200) -> str:
    """The page of ``rows`` as ``bench leaderboard`` builds it (its tables: Tables 3 and 4)."""
    groups = []
    for key, group in group_rows(rows).items():
        report = GroupReport(group, resamples)
        groups.append(group_data(group_title(key), report, table3_markdown(report) + table4_markdown(report)))
    return page_html(groups, "a note", resamples)


def _data(page: str) -> dict:
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))


def test_the_page_needs_no_network():
    """Everything is inline: no element loads a file or an address, no script fetches, and the one ``http`` in the
    page is the SVG namespace's name."""
    page = _page(ROWS)
    for loader in ("src=", "href=", "<link", "<iframe", "<img", "@import", "url(", "fetch(", "XMLHttpRequest",
                   "WebSocket", "EventSource", "import(", "sendBeacon"):
        assert loader not in page, loader
    assert re.findall(r"https?:[^\"']*", page) == ["http://www.w3.org/2000/svg"]
    assert page.count("<script") == 2 and page.count("<style>") == 1


def test_the_page_holds_the_numbers_the_markdown_prints():
    """Every curve of the leaderboard's average is the Markdown's averages table, cell by cell, at its digits."""
    page = _data(_page(ROWS))
    for key, group in group_rows(ROWS).items():
        report = GroupReport(group, 200)
        shown = next(g for g in page["groups"] if g["title"] == group_title(key))
        every = shown["sets"][0]
        assert every["name"] == ALL_TASKS and every["tasks"] == report.average_tasks
        for field, (_, _, digits) in METRICS.items():
            table = [line for line in report.averages_markdown(field) if line.startswith("| ")][1:]
            drawn = {m: {p: f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]" for p, mean, low, high in pts}
                     for m, pts in every[field]["curves"].items()}
            base = every[field]["base"]
            assert table[0] == "| no prune | " + " | ".join(
                [f"{base[0]:.{digits}f} [{base[1]:.{digits}f}, {base[2]:.{digits}f}]"] * len(FRACTIONS)) + " |"
            assert table[1:] == [f"| {m} | " + " | ".join(drawn[m][p] for p in FRACTIONS) + " |"
                                 for m in report.methods]
        # each task alone is offered, and each haystack's tasks where the group has two
        names = [s["name"] for s in shown["sets"]]
        assert names[1:3] == ["generated haystack", "manpages haystack"] and len(names) == 3 + 4


def test_the_same_rows_give_the_same_bytes_and_no_value_closes_the_script():
    assert _page(ROWS) == _page(list(ROWS))
    odd = [{**row, "press": "x</script><b>"} if row["press"] == "snapkv" else row for row in ROWS]
    page = _page(odd)
    assert page.count("</script>") == 2 and any("x</script><b>/flat" in m["name"]
                                                for g in _data(page)["groups"] for m in g["methods"])


def test_verify_docs_checks_the_page_as_it_checks_the_tables(model_dir, tmp_path, capsys):
    """A leaderboard lists its page in its manifest; a rebuild gives the same bytes; ``verify --docs`` refuses a
    page edited by hand (and a rebuild will not write over it) and a stray page the manifest does not list."""
    store = tmp_path / "store"
    run_compare(compare_settings(model_dir, store), show_progress=False)
    docs, again = tmp_path / "docs", tmp_path / "again"
    write_leaderboard([store], docs)
    # probe 7: a build killed before it cleaned up left its scratch folder, which no later build removed
    (again / ".leaderboard-build-killed").mkdir(parents=True)
    (again / ".leaderboard-build-killed" / "leaderboard.md").write_text("half")
    write_leaderboard([store], again, published=False)
    assert not any(again.glob(".leaderboard-build-*"))
    assert (docs / PAGE).read_bytes() == (again / PAGE).read_bytes()
    assert read_manifest(docs / MANIFEST)[PAGE] == sha256_of(docs / PAGE)
    verify_stores([store], docs, report=lambda line: None)
    page = (docs / PAGE).read_text()
    stray = docs / "leaderboard-old.html"
    stray.write_text(page)
    with pytest.raises(UsageError, match=f"{stray} is not in {docs / MANIFEST}"):
        verify_stores([store], docs, report=lambda line: None)
    stray.unlink()
    edited = page.replace("<h1>Leaderboard</h1>", "<h1>Our leaderboard</h1>").replace("Items per task", "Items")
    (docs / PAGE).write_text(edited)
    with pytest.raises(UsageError, match=f"{docs / PAGE} is not what the store says; it was edited by hand") as error:
        verify_stores([store], docs, report=lambda line: None)
    # the diff names both edits, each line of it cut short (a line of the page's data holds a whole group)
    assert "Our leaderboard" in str(error.value) and "Items per task" in str(error.value)
    assert max(map(len, page.splitlines())) > DIFF_WIDTH + 2 >= max(map(len, str(error.value).splitlines()))
    code, err = run_cli(capsys, "leaderboard", store, "--out", docs)
    assert code == 2 and f"{PAGE} there was not written by bench leaderboard as it is now" in err, err
    assert "Our leaderboard" in (docs / PAGE).read_text()


def _chromium():
    """A headless Chromium driven by selenium with Debian's chromedriver; skips where either is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("no chromium or chromedriver on PATH (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver)), profile


@pytest.fixture(scope="module")
def chromium():
    driver, profile = _chromium()
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _plotted(driver, method: str, p: float) -> tuple[float, float]:
    """The accuracy chart's point of ``method`` at ``p``: (its value read back from its height on the chart's own
    axis, the value it carries)."""
    return driver.execute_script("""
        const [method, p] = arguments, chart = document.getElementById("chart-score");
        const dot = [...chart.querySelectorAll(`g.method[data-method="${method}"] circle.point`)]
            .find(c => +c.getAttribute("data-p") === p);
        const ticks = [...chart.querySelectorAll("text.ytick")].map(t => [+t.dataset.value, +t.dataset.y]);
        const [[v0, y0], [v1, y1]] = [ticks[0], ticks[ticks.length - 1]];
        const cy = +dot.getAttribute("cy");
        return [v0 + (cy - y0) / (y1 - y0) * (v1 - v0), +dot.getAttribute("data-mean")];""", method, p)


@pytest.mark.browser
def test_the_page_draws_what_is_picked(chromium, tmp_path):
    """Loaded from file:// with no request made: one curve and one band per method; a method unticked leaves both
    charts and the numbers; a point sits at the embedded mean on the chart's axis; another task choice and another
    group draw their own numbers."""
    page = tmp_path / PAGE
    page.write_text(_page(ROWS))
    data = _data(page.read_text())
    chromium.get(page.as_uri())
    count = "return document.querySelectorAll(arguments[0]).length"
    assert chromium.execute_script("return performance.getEntriesByType('resource').length") == 0
    first = data["groups"][0]
    methods = [m["name"] for m in first["methods"]]
    assert chromium.execute_script(count, "#chart-score path.curve") == len(methods) == 5
    assert chromium.execute_script(count, "#chart-delta_nll path.band") == 5
    mean = dict((p, m) for p, m, _, _ in first["sets"][0]["score"]["curves"]["gatesight/gate"])[0.4]
    read, carried = _plotted(chromium, "gatesight/gate", 0.4)
    assert carried == mean and read == pytest.approx(mean, abs=1e-6)

    chromium.execute_script('document.querySelector(`#methods input[value="snapkv/flat"]`).click()')
    assert chromium.execute_script(count, "#chart-score path.curve") == 4
    assert chromium.execute_script(count, "#chart-delta_nll g.method[data-method='snapkv/flat']") == 0
    assert chromium.execute_script(count, "#numbers tr[data-method='snapkv/flat']") == 0

    alone = next(k for k, s in enumerate(first["sets"]) if s["name"] == "niah_multikey_1@manpages")
    chromium.execute_script('const s = document.getElementById("tasks"); s.value = arguments[0];'
                            's.dispatchEvent(new Event("change"))', str(alone))
    mean = dict((p, m) for p, m, _, _ in first["sets"][alone]["score"]["curves"]["gatesight/gate"])[0.7]
    read, carried = _plotted(chromium, "gatesight/gate", 0.7)
    assert carried == mean and read == pytest.approx(mean, abs=1e-6)
    assert mean != dict((p, m) for p, m, _, _ in first["sets"][0]["score"]["curves"]["gatesight/gate"])[0.7]

    chromium.execute_script('const s = document.getElementById("group"); s.value = "1";'
                            's.dispatchEvent(new Event("change"))')
    second = data["groups"][1]
    assert [m["name"] for m in second["methods"]] == ["kvzip/global", "snapkv/flat"]
    assert chromium.execute_script(count, "#chart-score path.curve") == 1  # snapkv/flat stays unticked
    mean = dict((p, m) for p, m, _, _ in second["sets"][0]["score"]["curves"]["kvzip/global"])[0.1]
    read, carried = _plotted(chromium, "kvzip/global", 0.1)
    assert carried == mean and read == pytest.approx(mean, abs=1e-6)
    assert chromium.execute_script(count, "#tables table") == 0  # neither table's methods ran in this group


@pytest.mark.browser
def test_one_kept_fraction_draws_a_point_per_method(chromium, tmp_path):
    """A group that ran one p: each method a point with its interval as a bar, in its own slot named under the
    axis (the PNG's layout), at its embedded mean."""
    page = tmp_path / PAGE
    page.write_text(_page(_rows(2048, METHODS, fractions=(0.5,))))
    curves = _data(page.read_text())["groups"][0]["sets"][0]["score"]["curves"]
    chromium.get(page.as_uri())
    count = "return document.querySelectorAll(arguments[0]).length"
    assert chromium.execute_script(count, "#chart-score path.curve") == 0
    assert chromium.execute_script(count, "#chart-score line.whisker") == len(curves) == 5
    names = chromium.execute_script('return [...document.querySelectorAll("#chart-score text.xtick")]'
                                    '.map(t => t.firstChild.nodeValue)')  # the text, without its tooltip
    assert names == list(curves)
    for method, [[p, mean, _, _]] in curves.items():
        read, carried = _plotted(chromium, method, p)
        assert carried == mean and read == pytest.approx(mean, abs=1e-6)
