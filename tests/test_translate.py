"""translate.py and trained/lines.py's translate_lines: your own sentences, long lines, bad input."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, assert_one_line_error, run_script


@pytest.mark.slow
def test_translate_round_trip(quick_start, tmp_path):
    """A file in, a file out, beam search, and a line longer than maxlen1 split with a note (stdin ->
    stdout, one line out per line in: test_translator_api_matches_the_script)."""
    import subprocess
    import sys

    from conftest import ROOT
    dirs = quick_start.dirs
    long_line = " ".join(["Der Hund schläft im Garten."] * 12)
    (tmp_path / "in.de").write_text(f"Das Kind liest ein Buch.\n{long_line}\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "translate.py", *dirs, "--beam_size", "4", "--input",
                          str(tmp_path / "in.de"), "--output", str(tmp_path / "out.en")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = (tmp_path / "out.en").read_text(encoding="utf-8").splitlines()
    assert len(out) == 2 and all(out)
    assert "in.de:2:" in run.stderr and "translated in" in run.stderr


def test_split_long_keeps_every_token(quick_start):
    import sentencepiece as spm

    from trained import lines
    sp = spm.SentencePieceProcessor(model_file=str(quick_start.prepro / "bpe.model"))
    text = "Der Hund schläft im Garten. " * 10 + "Einsehrlangeswortohneende" * 3
    pieces = lines.split_long(sp, text.strip(), 12)
    assert all(len(p) <= 12 for p in pieces)
    assert sp.decode([i for p in pieces for i in p]).replace(" ", "") == text.replace(" ", "")


def test_batches_follow_how_the_decoding_loops_run():
    """Loops compiled for each batch shape (XLA, JAX) or run eagerly (PyTorch) get lengths padded to
    multiples of PAD_MULTIPLE, and beam search a beam size's share of the budget; as one graph
    (TensorFlow without XLA) a batch is padded to its own lengths and beam search's batches are
    greedy's."""
    import types

    import keras
    import numpy as np

    import data_load
    from trained import lines
    lens = np.random.default_rng(0).integers(2, 40, size=500)
    for xla in (True, False):
        model = types.SimpleNamespace(maxlen1=64, xla_decoding=xla)
        fixed = xla or keras.backend.backend() != "tensorflow"
        greedy, beam = (lines.batches(model, lens, 512, beam_size) for beam_size in (1, 4))
        for batches, share in ((greedy, 512), (beam, 128 if fixed else 512)):
            assert sorted(np.concatenate([idx for idx, _ in batches]).tolist()) == list(range(len(lens)))
            assert all(len(idx) * t1 <= max(share, t1) for idx, t1 in batches)
            assert all(t1 % data_load.PAD_MULTIPLE == 0 for _, t1 in batches) == fixed
        if not fixed:
            assert [(idx.tolist(), t1) for idx, t1 in beam] == [(idx.tolist(), t1) for idx, t1 in greedy]


@pytest.mark.slow
def test_very_long_lines_translate_in_bounded_memory(quick_start, tmp_path):
    """Lines of thousands of tokens: cut into pieces the model can take, batched by tokens."""
    dirs = quick_start.dirs
    long_line = "Der Hund schläft im Garten, und die Katze spielt mit einem Ball. " * 300  # ~6000 tokens
    (tmp_path / "long.de").write_text("Ein Mann fährt Fahrrad.\n" + (long_line + "\n") * 5, encoding="utf-8")
    measure = ("import runpy, sys\nfrom support import utils\nsys.argv = ['translate.py'] + sys.argv[1:]\n"
               "try:\n    runpy.run_path('translate.py', run_name='__main__')\n"
               "finally:\n    print('peak_rss_mb', int(utils.peak_rss_mb()), file=sys.stderr)")
    run = run_script("-c", measure, *dirs, "--input", str(tmp_path / "long.de"), "--output", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr[-2000:]
    out = (tmp_path / "out").read_text(encoding="utf-8").split("\n")
    assert len(out) == 7 and out[6] == "" and all(out[:6])
    assert len(out[1].split()) > 1000  # every piece translated, joined on its line
    assert run.stderr.count("translated in") == 5
    peak = int(re.search(r"peak_rss_mb (\d+)", run.stderr).group(1))
    assert peak < 2000, f"translating long lines took {peak} MB"


def test_stdin_that_is_not_utf8_is_a_one_line_error_naming_the_line(quick_start):
    import subprocess
    import sys

    from conftest import ROOT
    dirs = quick_start.dirs
    run = subprocess.run([sys.executable, "translate.py", *dirs], input=b"Ein Hund.\nZwei \xff Katzen.\n", cwd=ROOT,
                         capture_output=True, timeout=300)
    run.stderr = run.stderr.decode("utf-8")
    assert_one_line_error(run, r"<stdin>:2: bytes that are not UTF-8")
    assert run.stdout == b"" and len(run.stderr.strip().splitlines()) == 1  # before Keras loads: nothing else


@pytest.mark.slow
def test_translate_from_a_pipe_with_verbose_shows_the_start_up_lines(quick_start):
    """TRANSFORMER_VERBOSE=1 shows TensorFlow's C++ start-up lines that a piped run keeps out of
    stderr (test_translator_api_matches_the_script checks the quiet run)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from trained.runs import Translator
    dirs = quick_start.dirs
    loud = subprocess.run([sys.executable, "translate.py", *dirs], input="Ein Mann fährt Fahrrad.\n", cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TRANSFORMER_VERBOSE="1"))
    assert loud.returncode == 0 and loud.stderr.strip()
    assert loud.stdout == Translator(str(quick_start.log)).translate("Ein Mann fährt Fahrrad.") + "\n"


@pytest.mark.slow
def test_translator_api_matches_the_script(quick_start):
    """Translator: loaded once, a list in one call, the same lines as translate.py prints from a
    pipe: one line out per line in, an empty line kept, and nothing on stderr (TensorFlow's C++
    start-up lines, oneDNN and CUDA probing on a machine without a GPU, and the progress bar stay out)."""
    import subprocess
    import sys

    from conftest import ROOT
    from trained.runs import Translator
    dirs = quick_start.dirs
    lines = ["Ein Mann fährt Fahrrad.", "", "Die  Frau\ttrinkt Kaffee.", "Das Kind spielt im Park."]
    translator = Translator(str(quick_start.log))
    got = translator.translate(lines)
    assert len(got) == 4 and got[1] == "" and all(got[i] for i in (0, 2, 3))
    assert translator.translate(lines[0]) == got[0]  # one sentence in, one string out
    run = subprocess.run([sys.executable, "translate.py", *dirs], input="\n".join(lines) + "\n", cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]
    assert run.stdout.split("\n")[:-1] == got
    beam = translator.translate(lines, beam_size=4)
    assert len(beam) == 4 and beam[1] == "" and all(beam[i] for i in (0, 2, 3))
    # the decoding a Translator uses unless told otherwise is a setting, as on the command line
    assert Translator(str(quick_start.log), beam_size=4).translate(lines) == beam


def test_before_training_the_hint_names_the_command_that_trains_this_run(tmp_path):
    """With --preset given, the train command to run first has it and the --logdir; without, it asks
    for the preset instead of suggesting the sample preset's."""
    log = str(tmp_path / "log")
    run = subprocess.run([sys.executable, "translate.py", "--preset", "multi30k", "--logdir", log], input="Hallo.\n",
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(run, re.escape(f"train first (python train.py --preset multi30k --logdir {log})"))
    run = run_script("eval.py", "--logdir", log)
    hint = f"train first (python train.py --preset <the preset to train> --logdir {log})"
    assert_one_line_error(run, re.escape(hint))


@pytest.mark.slow
@pytest.mark.parametrize("jit_compile", ["on", "off"])
def test_a_second_translate_process_on_the_same_file_compiles_nothing_new(quick_start, tmp_path, jit_compile):
    """translate.py keeps what it compiles in the cache beside the run folder (--compile_cache auto):
    with --jit_compile on the decoding programs XLA compiles, with off (a CPU's default on
    TensorFlow) the decoding loops it traces as one graph (compile_cache/graphs). The first process
    on a file writes them, a second process on the same file finds every one there and writes none."""
    import shutil

    run_dir = tmp_path / "runs" / "sample"  # its cache: tmp_path/runs/compile_cache, empty as yet
    shutil.copytree(quick_start.log, run_dir)
    lines = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Kind liest ein Buch im Garten."] * 7
    (tmp_path / "in.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cache = tmp_path / "runs" / "compile_cache"

    def written():  # the cache's files and when each was written: a program compiled again is written again
        return {str(path): os.stat(path).st_mtime_ns for path in cache.rglob("*") if path.is_file()}

    kept = []
    for k in range(2):  # fresh interpreters: TensorFlow reads where its cache is before its devices start
        run = subprocess.run([sys.executable, "translate.py", "--logdir", str(run_dir), "--prepro_dir",
                              str(quick_start.prepro), "--input", str(tmp_path / "in.de"), "--output",
                              str(tmp_path / f"out{k}.en"), "--beam_size", "2", "--jit_compile", jit_compile],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        kept.append(written())
    assert kept[0] and kept[1] == kept[0], kept
    if jit_compile == "off":
        assert [os.path.basename(path).split("-")[0] for path in kept[0]] == ["beam_loop"], kept[0]
    assert (tmp_path / "out0.en").read_text(encoding="utf-8") == (tmp_path / "out1.en").read_text(encoding="utf-8")
    # another file, other lines (with XLA, batched in the same shape: data_load.decode_batches, as
    # many lines, the longest the same): nothing new to compile or trace either
    other = ["Ein Hund.", "Eine Frau lacht.", "Kinder.", "Ein Kind liest ein Buch im Garten."] * 5 + ["Ein Ball."]
    (tmp_path / "other.de").write_text("\n".join(other) + "\n", encoding="utf-8")
    run = subprocess.run([sys.executable, "translate.py", "--logdir", str(run_dir), "--prepro_dir",
                          str(quick_start.prepro), "--input", str(tmp_path / "other.de"), "--output",
                          str(tmp_path / "other.en"), "--beam_size", "2", "--jit_compile", jit_compile], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert written() == kept[0]
    assert len((tmp_path / "other.en").read_text(encoding="utf-8").splitlines()) == len(other)
