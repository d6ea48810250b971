"""A user's press is its module's source and that of the user's own modules it imports, directly or through others:
an edit of a helper module is a new version of the press, whose rows are never pooled with the old ones (probe 14,
U1). The standard library, installed packages and the project are not the press's own code."""

import importlib
import py_compile
import sys
import textwrap

import pytest

import allocators
from bench.run.compare import run_compare
from bench.store.code_version import _normalised, _own_code, method_codes
from bench.store.project_modules import module_files
from presses import registry
from runtime.errors import UsageError
from tests.helpers import compare_settings

PRESS = '''
from dataclasses import dataclass

import presses
{imports}


@presses.register
@dataclass
class HelpedPress(presses.Press):
    """Keeps the entries its helper's ages rank first."""

    name = "helped"

    def score(self, context):
        {lazy}
        n_body = context.n - context.protected
        heads = context.adapter.geometry.num_kv_heads
        return {{layer: ages(n_body).expand(heads, n_body) for layer in context.adapter.attention_layers}}
'''
HELPER = '''
import torch
{imports}

SIGN = {sign}


def ages(n):
    return SIGN * torch.arange(n - 1, -1, -1, dtype=torch.float32)
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """``write(files, compiled, press)`` writes ``{relative path: source}`` under a folder on ``sys.path``, and each
    ``{module: source}`` of ``compiled`` there as a sourceless ``.pyc`` alone, and (re)imports the press module
    ``press``, as a user editing their files and rerunning; it returns the press's method code with ``flat``."""
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    monkeypatch.syspath_prepend(str(tmp_path))
    written: set[str] = set()

    def write(files: dict[str, str], compiled: dict[str, str] | None = None, press: str = "mp") -> str:
        for path, source in files.items():
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(textwrap.dedent(source))
            written.add(path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                        .removeprefix("site-packages."))
        for name, source in (compiled or {}).items():
            (tmp_path / "sources").mkdir(exist_ok=True)
            (tmp_path / "sources" / f"{name}.py").write_text(textwrap.dedent(source))
            py_compile.compile(str(tmp_path / "sources" / f"{name}.py"), cfile=str(tmp_path / f"{name}.pyc"),
                               doraise=True)
            (tmp_path / "sources" / f"{name}.py").unlink()
            written.add(name)
        registry.PRESSES.pop("helped", None)
        for name in written:
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        module = importlib.import_module(press)
        return method_codes([(module.HelpedPress(), allocators.get("flat"))])[0]

    yield write
    for name in written:
        sys.modules.pop(name, None)


def _press(imports="from hlp import ages", lazy="pass") -> str:
    return PRESS.format(imports=imports, lazy=lazy)


def test_an_edited_helper_module_is_a_new_version_of_the_press(user_code):
    first = user_code({"mp.py": _press(), "hlp.py": HELPER.format(imports="", sign=-1.0)})
    assert user_code({"hlp.py": HELPER.format(imports="", sign=1.0)}) != first
    # a comment or a docstring is no edit of what runs
    assert user_code({"hlp.py": '"""Ages."""\n' + HELPER.format(imports="# why", sign=-1.0)}) == first


def test_a_helper_of_a_helper_and_one_imported_inside_a_function_count(user_code):
    sign = "from hlp2 import SIGN"
    files = {"mp.py": _press(imports="", lazy="from hlp import ages"),
             "hlp.py": HELPER.format(imports=sign, sign="SIGN").replace("SIGN = SIGN\n", ""),
             "hlp2.py": "SIGN = -1.0\n"}
    first = user_code(files)
    assert "hlp" not in sys.modules  # imported only when the press scores: found without running it
    importlib.import_module("hlp")  # once it has run, the same code
    assert method_codes([(sys.modules["mp"].HelpedPress(), allocators.get("flat"))]) == [first]
    assert user_code({"hlp2.py": "SIGN = 1.0\n"}) != first


@pytest.mark.parametrize(("folder", "imports", "lazy"), [
    ("", "import importlib", 'ages = importlib.import_module("hlp").ages'),
    ("", "from importlib import import_module", 'ages = import_module(name="hlp").ages'),
    ("", "", 'ages = __import__("hlp").ages'),
    ("plug/", "import importlib", 'ages = importlib.import_module(".hlp", package=__package__).ages'),
    ("plug/", "import importlib", 'ages = importlib.import_module("..hlp", "plug.mp").ages'),
    ("plug/", "", 'ages = __import__("hlp", globals(), None, ["ages"], 1).ages'),
    ("", "from importlib import import_module as load", 'ages = load("hlp").ages'),  # probe 17: an alias
    ("", 'import importlib\nHELPER = "hlp"', "ages = importlib.import_module(HELPER).ages"),  # and a constant's
])
def test_a_helper_imported_by_its_name_counts(user_code, folder, imports, lazy):
    """Probe 16, #4: a helper the press loads by a call, ``importlib.import_module("dynhelp")`` (a plugin's way), was
    left out of its code, and the rows of two versions of it were pooled under one method code. A call whose module
    is written out counts as an import of it, relative ones too, and (probe 17) by an alias of ``import_module`` or
    through a module-level constant."""
    press = f"{folder.replace('/', '.')}mp"
    files = {f"{folder}mp.py": _press(imports=imports, lazy=lazy),
             f"{folder}hlp.py": HELPER.format(imports="", sign=-1.0),
             **({f"{folder}__init__.py": ""} if folder else {})}
    first = user_code(files, press=press)
    assert user_code({f"{folder}hlp.py": HELPER.format(imports="", sign=1.0)}, press=press) != first


def test_an_installed_module_is_not_the_press_s_own_code(user_code, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    first = user_code({"mp.py": _press(), "site-packages/hlp.py": HELPER.format(imports="", sign=-1.0)})
    assert user_code({"site-packages/hlp.py": HELPER.format(imports="", sign=1.0)}) == first


def test_a_sourceless_helper_module_is_hashed_by_its_bytes(user_code):
    """Probe 15, #4: a helper that exists only as a ``.pyc`` (or a compiled extension) was skipped, so two versions
    of it pooled their rows under one method code."""
    first = user_code({"mp.py": _press()}, compiled={"hlp": HELPER.format(imports="", sign=-1.0)})
    assert user_code({}, compiled={"hlp": HELPER.format(imports="", sign=1.0)}) != first


def test_an_installed_press_s_own_package_is_its_code_and_other_packages_are_not(user_code, tmp_path, monkeypatch):
    """Probe 15 (not counted): a press an installed package registers (an entry point's) had its package's helpers
    left out as installed, so an upgrade that changed only a helper pooled rows. Its own top-level package counts
    wherever it is installed; another installed package (``other``, as torch) does not."""
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    files = {"site-packages/plug/__init__.py": "", "site-packages/plug/mp.py": _press("from .hlp import ages"),
             "site-packages/plug/hlp.py": HELPER.format(imports="from other import SCALE", sign=-1.0),
             "site-packages/other.py": "SCALE = 1.0\n"}
    first = user_code(files, press="plug.mp")
    assert user_code({"site-packages/other.py": "SCALE = 2.0\n"}, press="plug.mp") == first
    assert user_code({"site-packages/plug/hlp.py": HELPER.format(imports="", sign=1.0)}, press="plug.mp") != first


def test_a_press_without_helpers_keeps_its_code(user_code):
    """Its module's source alone, as before helpers were hashed: a store of such a press keeps taking its rows."""
    source = _press(imports="import torch\nfrom presses import selection\n\nages = torch.ones",)
    user_code({"mp.py": source})
    cls = sys.modules["mp"].HelpedPress
    files = module_files()
    assert _own_code(cls, "hf", files, set()) == b"mp.HelpedPress\n" + _normalised(textwrap.dedent(source))


def test_rows_of_an_edited_helper_are_refused_beside_the_old_ones(user_code, model_dir, tmp_path):
    """The README's promise: edit the press (here its helper) and rerun into the same store, and the run refuses to
    pool the new rows with the old ones."""
    out = tmp_path / "store"
    user_code({"mp.py": _press(), "hlp.py": HELPER.format(imports="", sign=-1.0)})
    settings = compare_settings(model_dir, out, presses=["helped", "none"], keep_fractions=[0.3])
    run_compare(settings, show_progress=False)
    kept = (out / "results.jsonl").read_bytes()
    user_code({"hlp.py": HELPER.format(imports="", sign=1.0)})
    with pytest.raises(UsageError, match="another version of its own code"):
        run_compare(compare_settings(model_dir, out, presses=["helped", "none"], keep_fractions=[0.3], n=2),
                    show_progress=False)
    assert (out / "results.jsonl").read_bytes() == kept
