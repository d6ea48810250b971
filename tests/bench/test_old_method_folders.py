"""A collection published by an older bench, whose method folder is named as that bench named it (before each label
had a folder of its own, probe 14), is refused naming the folder it is now and the ``mv`` that renames it, not as a
file changed after it was published (probe 15, U1)."""

import gzip
import json

from bench.run.compare import run_compare
from bench.store.collection import method_folder, stores_below
from bench.store.row_fields import method_of
from tests.helpers import compare_settings, run_cli


def _published(model_dir, tmp_path, capsys, pairs):
    run, collection = tmp_path / "run", tmp_path / "results"
    run_compare(compare_settings(model_dir, run, presses=[], allocators=[], pairs=pairs), show_progress=False)
    code, err = run_cli(capsys, "publish", run, "--into", collection)
    assert code == 0, err
    return collection


def test_a_folder_an_older_bench_named_is_refused_naming_its_rename(model_dir, tmp_path, capsys):
    collection = _published(model_dir, tmp_path, capsys, ["snapkv/adakv[safeguard=0.3]"])
    [now] = [store for store in stores_below(collection) if store.name.startswith("snapkv--adakv")]
    assert now.name == "snapkv--adakv_safeguard_0.3-c0632f5fb1"
    old = now.with_name("snapkv--adakv_safeguard_0.3")  # its name before a5cca8a
    now.rename(old)
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and err.endswith(
        f"{old / 'results.jsonl.gz'}: the folder {old.name} holds the rows of snapkv/adakv(safeguard=0.3), and is "
        f"named as a bench older than this one named that method's folder, now {now.name} (one folder a label): "
        f"rename it, `mv {old} {now}`"), err
    assert "version control" not in err
    old.rename(now)
    assert run_cli(capsys, "verify", collection)[0] == 0


def test_a_folder_an_older_bench_gave_two_labels_names_each_one_s_folder(model_dir, tmp_path, capsys):
    """``kvzip(prompt=a b)`` and ``kvzip(prompt=a_b)`` shared one folder before each label had its own: no one
    rename splits it, so the folder of each label's rows is named."""
    collection = _published(model_dir, tmp_path, capsys, ["kvzip[prompt=a b]/flat",
                                                          "kvzip[prompt=a_b]/flat"])
    stores = sorted(store for store in stores_below(collection) if store.name.startswith("kvzip"))
    rows = [json.loads(line) for store in stores for line in gzip.open(store / "results.jsonl.gz", "rt")]
    folders = {method_of(row): method_folder(row) for row in rows}
    assert sorted(folders) == ["kvzip(prompt=a b)/flat", "kvzip(prompt=a_b)/flat"]
    old = stores[0].with_name("kvzip_prompt_a_b_--flat")
    old.mkdir()
    (old / "results.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    for store in stores:
        (store / "results.jsonl.gz").unlink()
        store.rmdir()
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and err.endswith(
        f"{old / 'results.jsonl.gz'}: the folder {old.name} holds the rows of kvzip(prompt=a b)/flat and "
        "kvzip(prompt=a_b)/flat, and is named as a bench older than this one named their folders, each of its own "
        f"now (one folder a label): move each one's rows into its own folder in {old.parent}, kvzip(prompt=a b)/flat "
        f"into {folders['kvzip(prompt=a b)/flat']}, kvzip(prompt=a_b)/flat into "
        f"{folders['kvzip(prompt=a_b)/flat']}"), err
