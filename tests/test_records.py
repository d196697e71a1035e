"""The documents' figures come from records: bench/tables.py draws each table from docs/records/ and
finds every figure outside the tables that no record has."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, bench_module

from support import records

tables = bench_module("tables")


def test_every_table_is_its_records_and_every_figure_has_one():
    result = subprocess.run([sys.executable, "bench/tables.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for document, (text, _) in tables.drawn().items():
        for match in tables.BLOCK.finditer(text):
            assert match.group(3).count("\n") >= 3, f"{document}: table {match.group(2)} has no row"


def test_the_readmes_tables_and_the_results_pages_have_each_kind_of_record():
    drawn = tables.drawn()
    names = {document: {m.group(2) for m in tables.BLOCK.finditer(text)} for document, (text, _) in drawn.items()}
    assert {"footprint", "memory", "quickstart", "results"} <= names["README.md"], names
    assert names["README.zh.md"] == names["README.md"]
    assert "results_full" in names["docs/results.md"] and "translate_speed" in names["docs/speed.md"]


def test_a_figure_without_a_record_is_found():
    record = dict(records.make("bleu", dict(preset="sample", split="test", beam_size=1, sacrebleu=57.88,
                                            reference_bleu=54.14, train_minutes=0.5), "float32", command="eval.py"),
                  file="r.json")
    text = "It scores 57.88 and trains in 0.5 minutes. It took 12.3456 minutes, 4141 MB and 9797% more; Python 3.11.\n"
    assert tables.unrecorded(text, [record]) == ["12.3456", "4141", "9797"]
    drawn_table = tables.draw("<!-- table results_full (drawn by bench/tables.py from docs/records/: do not edit) "
                              "-->\n<!-- end table results_full -->\n", [record], "en")
    assert "57.88" in drawn_table and tables.unrecorded(drawn_table, []) == []  # a table's figures: its records'


def test_a_changed_table_is_found(tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    all_records = records.read_folder(tables.RECORDS)
    assert tables.draw(text, all_records, "en") == text
    table = tables.BLOCK.search(text)
    changed = text.replace(table.group(3), table.group(3).replace("|", "| 1 |", 1))
    assert tables.draw(changed, all_records, "en") == text


def test_a_record_is_read_or_refused_with_its_file(tmp_path):
    good = records.make("bleu", {"sacrebleu": 1.0}, "float32", command="eval.py")
    assert set(records.REQUIRED) <= set(good) and good["machine"]["cores"] >= 1
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"kind": "bleu"}))
    with pytest.raises(records.UserError, match="r.json: not a record, it lacks date"):
        records.read(str(path))
    path.write_text("{")
    with pytest.raises(records.UserError, match="r.json:1: not JSON"):
        records.read(str(path))


AMD = {"vendor_id": "AuthenticAMD", "model name": "AMD EPYC"}


@pytest.mark.parametrize("info,name", [
    ({**AMD, "cpu family": "25", "model": "17"}, "AMD EPYC, Zen 4"),
    ({**AMD, "cpu family": "26", "model": "2"}, "AMD EPYC, Zen 5"),
    ({**AMD, "cpu family": "25", "model": "1"}, "AMD EPYC, Zen 3"),
    ({"vendor_id": "GenuineIntel", "model name": "Intel(R) Xeon(R) Processor"}, "Intel Xeon"),
])
def test_the_cpu_class(info, name):
    assert records.cpu_class(info) == name


def test_add_keeps_an_eval_record_under_its_runs_name(tmp_path, monkeypatch):
    results = tmp_path / "log" / "myrun" / "results"
    results.mkdir(parents=True)
    records.write(str(results / "test_E01.json"), records.make("bleu", {"sacrebleu": 1.0}, "float32", "eval.py"))
    kept = tmp_path / "kept"
    kept.mkdir()
    monkeypatch.setattr(tables, "RECORDS", str(kept))
    tables.add([str(results / "test_E01.json")])
    (name,) = os.listdir(kept)
    assert name.endswith("-bleu-myrun-test_E01.json") and records.read(str(kept / name))["figures"]["sacrebleu"] == 1.0
