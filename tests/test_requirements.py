"""The requirements in groups (requirements/): every group pinned by the lock file, setup.sh's
groups, and the core alone enough for the scripts' main paths (the other groups' packages made
unimportable, as after `bash setup.sh`), with a one-line error that says how to add a group."""
import json
import os
import re
import subprocess

import pytest
from packaging.requirements import Requirement

from conftest import ENGLISH, GERMAN, ROOT, assert_one_line_error, run_script, write_parallel

GROUPS = ("core", "export", "jax", "page", "dev", "notebook")


def normalised(name):
    """A package's name as pip compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(group):
    """The Requirements a group file names, with those of the files it includes (-r)."""
    found = []
    with open(os.path.join(ROOT, "requirements", f"{group}.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.startswith("-r "):
                found += requirements(line[3:].strip()[:-len(".txt")])
            elif line:
                found.append(Requirement(line))
    return found


def locked():
    """{normalised name: version} of requirements/lock.txt."""
    with open(os.path.join(ROOT, "requirements", "lock.txt"), encoding="utf-8") as f:
        pins = [line.strip().split("==") for line in f if line.strip() and not line.startswith("#")]
    return {normalised(name): version for name, version in pins}


def test_every_group_is_pinned_by_the_lock_within_its_ranges():
    pins = locked()
    for group in GROUPS:
        for requirement in requirements(group):
            name = normalised(requirement.name)
            assert name in pins, f"requirements/{group}.txt: {requirement.name} has no pin in requirements/lock.txt"
            assert requirement.specifier.contains(pins[name]), f"{group}: {requirement} excludes the pin {pins[name]}"
    assert {r.name for r in requirements("dev")} >= {r.name for g in GROUPS[:3] for r in requirements(g)}
    assert not {"jax", "ctranslate2", "tensorflow-text", "pytest"} & {r.name for r in requirements("core")}


def test_setup_refuses_a_group_that_does_not_exist():
    run = subprocess.run(["bash", "setup.sh", "everything"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no requirement group 'everything'" in run.stderr, run.stderr


def test_the_lessons_first_cell_installs_the_notebook_list_a_part_of_the_core():
    with open(os.path.join(ROOT, "lesson.ipynb"), encoding="utf-8") as f:
        setup = next("".join(c["source"]) for c in json.load(f)["cells"] if c.get("id") == "setup")
    assert '"-r", "requirements/notebook.txt"' in setup
    core = {normalised(r.name): r.specifier for r in requirements("core")}
    for requirement in requirements("notebook"):  # the same ranges as the core's: one set of versions
        assert core.get(normalised(requirement.name)) == requirement.specifier, requirement


def core_only(*args, cwd=ROOT):
    """A script run with only the core installed: the other groups' packages made unimportable."""
    return run_script(os.path.join("tests", "without.py"), "core", *args, cwd=cwd)


@pytest.mark.slow
def test_the_scripts_main_paths_need_only_the_core(tmp_path, quick_start):
    raw = tmp_path / "raw"
    write_parallel(raw, "train", GERMAN * 5, ENGLISH * 5)
    write_parallel(raw, "dev", GERMAN[:3], ENGLISH[:3])
    write_parallel(raw, "test", GERMAN[3:], ENGLISH[3:])
    prepro, log = str(tmp_path / "prepro"), str(tmp_path / "log")
    (tmp_path / "in.de").write_text("Ein Mann fährt Fahrrad.\n", encoding="utf-8")
    runs = [core_only("prepro.py", "--data_dir", str(raw), "--prepro_dir", prepro, "--vocab_size", "60"),
            core_only("train.py", "--prepro_dir", prepro, "--logdir", log, "--num_epochs", "1", "--d_model", "16",
                      "--d_ff", "32", "--num_blocks", "1", "--num_heads", "2", "--eval_sentences", "3"),
            core_only("eval.py", *quick_start.dirs),
            core_only("translate.py", *quick_start.dirs, "--input", str(tmp_path / "in.de")),
            core_only("attention.py", *quick_start.dirs, "--output", str(tmp_path / "a.png"), GERMAN[0]),
            core_only("plot.py", str(quick_start.log), "--output", str(tmp_path / "h.png"))]
    for run in runs:
        assert run.returncode == 0 and "Traceback" not in run.stderr, " ".join(run.args) + "\n" + run.stderr[-3000:]
    assert "BLEU test sacreBLEU" in runs[2].stdout and runs[3].stdout.strip()
    assert (tmp_path / "a.png").is_file() and (tmp_path / "h.png").is_file()


@pytest.mark.parametrize("format", ["ctranslate2", "saved_model"])
def test_export_without_its_group_says_how_to_add_it(tmp_path, quick_start, format):
    run = core_only("export.py", *quick_start.dirs, "--format", format, "--output", str(tmp_path / "out"))
    assert_one_line_error(run, r"(ctranslate2|tensorflow_text) is not installed .*`bash setup.sh export`")
    assert not (tmp_path / "out").exists()
