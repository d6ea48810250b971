"""Method folders of one group whose names differ in letter case alone (probe 16, U3): ``kvzip(prompt=A)/flat`` and
``kvzip(prompt=a)/flat`` both read back from their slugs, so neither takes a digest, and on a file system that ignores
case (macOS, Windows) their folders are one. Publish refuses the second before writing, and verify names a
collection that holds both."""

import shutil

import pytest

from bench.run.compare import run_compare
from bench.store.collection import stores_below
from tests.helpers import compare_settings, run_cli, store_of, stored_rows


@pytest.fixture(scope="module")
def stores(model_dir, tmp_path_factory):
    """Two stores of one group: no prune and ``kvzip(prompt=A)/flat``, no prune and ``kvzip(prompt=a)/flat``."""
    folder = tmp_path_factory.mktemp("case")
    run_compare(compare_settings(model_dir, folder / "both", presses=[], allocators=[],
                                 pairs=["kvzip[prompt=A]/flat", "kvzip[prompt=a]/flat"]), show_progress=False)
    rows = stored_rows(folder / "both")
    return folder / "both", *(store_of([row for row in rows if row["press"] in ("none", f"kvzip(prompt={prompt})")],
                                       folder / prompt) for prompt in ("A", "a"))


def _files(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _twins(collection, group):
    return (f"{group / 'kvzip_prompt_A_--flat'} and {group / 'kvzip_prompt_a_--flat'}: two method folders of the "
            f"setting group {group} whose names differ in letter case alone, which a file system that ignores case "
            "(macOS, Windows) holds as one folder: a clone there loses one method's rows; keep one of the two in "
            "another collection")


def test_a_method_folder_equal_to_another_but_for_case_is_refused(stores, tmp_path, capsys):
    both, upper, lower = stores
    collection = tmp_path / "results"
    code, err = run_cli(capsys, "publish", both, "--into", collection)
    assert code == 2 and not collection.exists(), err
    assert run_cli(capsys, "publish", upper, "--into", collection)[0] == 0
    [group] = collection.iterdir()
    assert _twins(collection, group) in err, err
    before = _files(collection)
    code, err = run_cli(capsys, "publish", lower, "--into", collection)
    assert code == 2 and err.endswith(_twins(collection, group)), err
    assert _files(collection) == before
    # a collection that holds both (copied in by hand) is named by verify
    other = tmp_path / "other"
    assert run_cli(capsys, "publish", lower, "--into", other)[0] == 0
    shutil.copytree(other / group.name / "kvzip_prompt_a_--flat", group / "kvzip_prompt_a_--flat")
    assert len(stores_below(collection)) == 3
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and err.endswith(_twins(collection, group)), err
