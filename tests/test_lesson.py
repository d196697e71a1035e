"""The lesson (lesson.ipynb, lesson.zh.ipynb): it runs top to bottom in a copy of the repository,
shows what its text says it shows, defines none of the project's layers or functions again, and its
stored outputs and Chinese text are not older than the code and the English text."""
import ast
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from support.utils import CPUINFO
from test_docs import CODE, MODULES, resolves

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from lesson import make as make_lesson  # noqa: E402  (after the skips: it needs nbformat)


def code_cells(nb):
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def texts(cell):
    """A cell's printed text and whether it showed a picture."""
    printed, pictures = [], 0
    for output in cell.outputs:
        if output.output_type == "stream":
            printed.append(output.text)
        elif "image/png" in output.get("data", {}):
            pictures += 1
    return "".join(printed), pictures


class Executed(dict):
    """The lesson's cells by id, with the CPU it ran as and the precisions its trainings ran in."""


@pytest.fixture(scope="module", params=["this CPU", "a CPU without bfloat16"])
def executed(request, tmp_path_factory):
    """The lesson, run in a copy of the repository's tracked files (it writes prepro/ and log/): as
    this machine runs it, and as a CPU without bfloat16 instructions would (its description, read
    in place of /proc/cpuinfo, lists none: every training runs in float32)."""
    copy = make_lesson.fresh_copy(str(tmp_path_factory.mktemp("lesson")))
    nb = make_lesson.read(os.path.join(copy, "lesson.ipynb"))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    before = os.environ.get(CPUINFO)
    if request.param == "a CPU without bfloat16":
        cpuinfo = os.path.join(copy, "cpuinfo-without-bfloat16")
        with open(cpuinfo, "w") as f:
            f.write("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: a CPU without bfloat16\n"
                    "flags\t\t: fpu sse sse2 avx avx2 fma avx512f\n")
        os.environ[CPUINFO] = cpuinfo  # the kernel the lesson runs in inherits it
    try:
        cells = Executed((cell.id, cell) for cell in make_lesson.execute(nb, copy).cells)
        cells.cpu = request.param
        cells.precisions = {json.loads(line)["precision"] for history in glob.glob(os.path.join(copy, "log", "**",
                                                                                                 "history.jsonl"),
                                                                                   recursive=True)
                            for line in open(history, encoding="utf-8") if line.strip()}
        return cells
    finally:
        if before is None:
            os.environ.pop(CPUINFO, None)
        else:
            os.environ[CPUINFO] = before


@pytest.mark.slow
def test_the_lesson_runs_and_shows_what_it_says(executed):
    from support.utils import cpu_has_bfloat16

    bfloat16 = executed.cpu == "this CPU" and cpu_has_bfloat16()
    assert executed.precisions == {"mixed_bfloat16" if bfloat16 else "float32"}, executed.precisions
    shown = {name: texts(cell) for name, cell in executed.items() if cell.cell_type == "code"}
    assert sum(pictures for _, pictures in shown.values()) >= 12
    assert shown["overview"][1] == 1  # the architecture, drawn from the model
    forward = shown["forward"][0]
    assert "the same logits as the whole model: True" in forward
    assert re.search(r"^logits +\(1, \d+, \d+\)", forward, re.M)
    assert re.search(r"^decoder_1 +\(1, \d+, 64\)", forward, re.M)
    assert "PE[10]·PE[12] = " in shown["positions"][0]
    leak = shown["leak"][0]
    assert "causal=True   largest change at positions 0-3: 0.000000" in leak
    assert float(leak.split("causal=False  largest change at positions 0-3: ")[1].split()[0]) > 0.01
    scaled, unscaled = (float(x.split()[0]) for x in shown["scaling"][0].split("mean largest weight: ")[1]
                        .split(" divided, "))
    assert unscaled > scaled + 0.2  # the softmax saturates without the division
    # the gradient to a query, measured: with the division about the same at every d_k; without it, at d_k 256,
    # a share of the queries gets almost none (what its text says), and on the untrained model's first layer
    # (d_k 16) it is larger without the division
    pattern = r"d_k +(\d+), (divided by √d_k|not divided) *: mean ([\d.]+), median ([\d.]+), .* \(below 0.001\) +(\d+)%"
    random = {(int(d), name): (float(mean), float(median), int(share))
              for d, name, mean, median, share in re.findall(pattern, shown["scaling"][0])}
    assert len(random) == 6, shown["scaling"][0]
    assert all(random[d, "divided by √d_k"][2] == 0 for d in (16, 64, 256))
    assert 20 <= random[256, "not divided"][2] <= 50  # "about a third"
    assert random[256, "not divided"][1] < random[256, "divided by √d_k"][1] < random[16, "not divided"][1]
    assert all(random[d, "not divided"][0] > random[d, "divided by √d_k"][0] for d in (16, 64, 256))  # the mean
    pattern = r"(divided by √d_k|not divided) *: largest weight ([\d.]+), gradient to a query: mean ([\d.]+)"
    own = {name: (float(w), float(g)) for name, w, g in re.findall(pattern, shown["scaling"][0])}
    assert own["not divided"][0] > own["divided by √d_k"][0] and own["not divided"][1] > own["divided by √d_k"][1]
    assert "the same tokens: True" in shown["cache"][0]
    greedy = shown["greedy"][0]
    assert greedy.split("greedy:    ")[1].splitlines()[0] == greedy.split("compiled:  ")[1].splitlines()[0]
    beam = shown["beam"][0]
    returned = beam.split("beam search:  ")[1].splitlines()[0].strip()
    assert returned == beam.split("compiled:     ")[1].splitlines()[0].strip()
    assert beam.split("red path:     ")[1].splitlines()[0].strip() == returned  # the path drawn red is the one returned
    assert beam.count("<- returned") == 1 and shown["beam"][1] == 1
    assert "(the red circles of the right-hand map)" in shown["inside"][0] and shown["inside"][1] == 2
    assert "epoch 30:" in shown["train"][0] and shown["train"][1] == 1
    assert "--positional none  epoch 30: dev loss" in shown["change"][0] and "preset             epoch 30" in shown[
        "change"][0]  # like with like: the same epochs
    # without positions a permuted source is the same source: its memory permuted, its translations the same
    order = shown["order"][0]
    pattern = r"(with positions \(the preset\)|--positional none): .* differs from the original's by at most ([\d.]+)"
    differs = {name: float(x) for name, x in re.findall(pattern, order)}
    assert differs["--positional none"] * 20 < differs["with positions (the preset)"], order
    assert "--positional none: 0 of 8 translations change when the words are reversed" in order
    changed = int(re.search(r"with positions \(the preset\): (\d) of 8", order).group(1))
    assert changed >= 1, order
    for cell, flags in (("exercise-embeddings", "--scale_embeddings 0"), ("exercise-smoothing", "--smoothing 0"),
                        ("exercise-warmup", "--warmup_steps 10")):
        printed = shown[cell][0]
        assert re.search(r"^preset +epoch 1: train loss [\d.]+; epoch 30: .*dev BLEU [\d.]+$", printed, re.M), printed
        assert re.search(rf"^{re.escape(flags)} +epoch 1: train loss [\d.]+; epoch 30: .*dev BLEU [\d.]+$", printed,
                         re.M), printed
    smoothing = shown["smoothing"][0]
    assert re.search(r"optimal probability 0\.9\d\d; the loss's floor 0\.\d+", smoothing) and shown["smoothing"][1] == 1
    assert smoothing.count("above 0.99 0.0%") == 2  # none comes near 1, with dropout or without


@pytest.mark.slow
def test_the_first_cell_clones_once_and_runs_again(tmp_path):
    """The lesson's first cell, outside the repository with REPOSITORY set (here a local path, not
    the network): it clones, installs the notebook list, imports; run again in the same kernel and
    in a new one (Colab's restart), it neither clones again nor fails."""
    nb = make_lesson.read(make_lesson.LESSON)
    cell = next(c.source for c in nb.cells if c.id == "setup")
    assert 'REPOSITORY = ""' in cell
    script = tmp_path / "first_cell.py"
    script.write_text(cell.replace('REPOSITORY = ""', f"REPOSITORY = {ROOT!r}") + "\n", encoding="utf-8")
    runs = "import runpy, sys\nfor _ in range(int(sys.argv[1])):\n    runpy.run_path(sys.argv[2])\n"
    for times in (2, 1):  # twice in one kernel, then once more in a fresh one
        done = subprocess.run([sys.executable, "-c", runs, str(times), str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600, env=dict(os.environ, MPLBACKEND="Agg"))
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("Keras ") == times, done.stdout
    assert (tmp_path / "transformer" / "modules.py").is_file()
    assert not (tmp_path / "transformer" / "transformer").exists()  # cloned once, not inside itself


def test_the_lesson_defines_none_of_the_projects_layers_or_functions():
    nb = make_lesson.read(make_lesson.LESSON)
    project = set()
    for name in ("modules.py", "model.py", "decoding.py"):
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        project |= {node.name for node in ast.walk(tree)
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    defined = {node.name for source in code_cells(nb) for node in ast.walk(ast.parse(source))
               if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert not defined & project, f"the lesson defines again: {sorted(defined & project)}; import them instead"


def test_the_stored_outputs_are_not_older_than_the_code():
    nb = make_lesson.read(make_lesson.LESSON)
    stored = nb.metadata.get("lesson", {}).get("sources")
    assert stored == make_lesson.sources_digest(nb), (
        "lesson.ipynb's stored outputs are older than its code or the project's code: run "
        "`python -m lesson.make` and commit both notebooks")
    assert all(cell.outputs for cell in nb.cells if cell.cell_type == "code")
    assert os.path.getsize(make_lesson.LESSON) < 1_000_000  # small enough to render where the repository is browsed


def test_the_chinese_lesson_is_the_english_one_with_translated_text():
    nb = make_lesson.read(make_lesson.LESSON)
    built = make_lesson.chinese(nb, make_lesson.read_translations())  # fails on an outdated translation
    stored = make_lesson.read(make_lesson.LESSON_ZH)
    assert [(c.cell_type, c.source) for c in stored.cells] == [(c.cell_type, c.source) for c in built.cells], (
        "lesson.zh.ipynb is not what lesson/make.py builds: run `python -m lesson.make --zh`")
    assert [c.get("outputs") for c in stored.cells] == [c.get("outputs") for c in nb.cells]
    assert code_cells(stored) == code_cells(nb)


@pytest.mark.parametrize("path", [make_lesson.LESSON, make_lesson.LESSON_ZH])
def test_the_lessons_text_names_code_that_exists(path):
    nb = make_lesson.read(path)
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    references = [s for s in CODE.findall(text) if re.fullmatch(r"\w+(\.\w+)+", s) and s.split(".")[0] in MODULES]
    assert len(references) >= 10, references
    missing = sorted({r for r in references if not resolves(r)})
    assert not missing, f"{path} names code that does not exist: {missing}"


@pytest.mark.parametrize("path", [make_lesson.LESSON, make_lesson.LESSON_ZH])
def test_every_call_the_lessons_text_suggests_runs(path):
    import importlib

    nb = make_lesson.read(path)
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    calls = [s for s in re.findall(r"`([^`\n]+)`", text) if re.fullmatch(r"(\w+ = )?\w+(\.\w+)*\(.*\)", s)]
    assert calls, "the lesson's text suggests no call: this test checks nothing"
    # the names the lesson's first cell imports
    namespace = {name: importlib.import_module(module) for name, module in (
        ("data_load", "data_load"), ("decoding", "decoding"), ("hyperparams", "hyperparams"),
        ("transformer", "model"), ("modules", "modules"), ("pictures", "support.pictures"), ("runs", "trained.runs"))}
    for call in calls:
        exec(call, namespace)  # raises as the learner would see it
