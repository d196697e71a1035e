"""The port computes the reference's numbers: Kyubyong Park's own code (commit fb023bb), run unedited
by reference.py in a process of its own, against the port given the same weights (converted by
reference.py convert). Skipped, with the reason, where the reference's files or tf_keras are missing."""
import os
import re
import subprocess
import sys

import pytest

import reference
from conftest import ROOT, run_script

CODE = os.path.join(os.path.dirname(ROOT), "shared", "reference", "kyubyong-transformer-fb023bb")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.isfile(os.path.join(CODE, "train.py")),
                                 reason=f"the reference's files are not at {CODE}"),
              pytest.mark.skipif(__import__("importlib").util.find_spec("tf_keras") is None,
                                 reason="tf_keras is not installed (bash setup.sh dev)")]


def test_the_port_computes_the_references_numbers(quick_start, tmp_path):
    """reference.py check: the reference's own code and the port from the same random weights agree
    on the logits (1e-5), on the loss and every weight after each of five training steps with each
    side's own optimizer and schedule (1e-5; the key biases, whose true gradient is 0, apart), on
    greedy dev translations line for line (the reference's test.py restoring the port's weights),
    and on multi-bleu.perl's BLEU (0.01); and the steps moved the weights far beyond the tolerance."""
    run = run_script("reference.py", "check", "--reference_dir", CODE, "--prepro_dir", str(quick_start.prepro),
                     "--workdir", str(tmp_path / "check"), timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    report = run.stdout[run.stdout.index("The reference's code (commit fb023bb)"):].splitlines()
    rows = report[1:-1]
    assert len(rows) == 1 + 2 * 5 + 2 + 2 and all(line.startswith("ok   ") for line in rows), report
    assert report[-1] == f"{len(rows)} of {len(rows)} agree: the port computes the reference's numbers"
    assert float(re.search(r"moved the weights by \(largest change\): ([\d.e-]+)", run.stdout).group(1)) > 1e-2
    compared = re.search(r"lines that differ, of the (\d+) compared \((\d+) left out", run.stdout)
    assert int(compared.group(1)) >= int(compared.group(2)), report


def test_a_failed_comparison_is_reported_and_fails_the_check():
    """A row beyond its bound is printed FAIL and not ok (the check exits 1 on one)."""
    assert not reference.within("x", 2e-5, reference.TOLERANCE).ok
    assert reference.within("x", 2e-5, reference.TOLERANCE).line() == "FAIL x: 2e-05 (at most 1e-05)"
    assert reference.within("x", 0.0, reference.TOLERANCE).line().startswith("ok   x: 0")


def test_the_reference_trains_as_published_and_its_checkpoint_serves_the_port(quick_start, tmp_path):
    """reference.py train runs the reference's own train.py (one epoch, tiny): it writes its dev
    translations and a checkpoint; converted, the checkpoint decodes dev greedily to the reference's
    own translations, and translate.py (beam 4) and export.py take the converted run."""
    prepro, work = str(quick_start.prepro), tmp_path / "work"
    run = run_script("reference.py", "train", "--reference_dir", CODE, "--prepro_dir", prepro, "--workdir", str(work),
                     "--", "--num_epochs", "1", "--batch_size", "64", "--lr", "0.003", "--warmup_steps", "4",
                     *reference.CHECK_SIZES, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    (translations,) = (work / "eval" / "1").iterdir()
    theirs = translations.read_text(encoding="utf-8").splitlines()
    # its own multi-bleu.perl ran, unless every translation has fewer than 4 words: it then divides by
    # zero (its 4-gram count) and prints nothing, which a model this small trained for 8 steps can hit
    assert theirs[-1].startswith("BLEU = ") or max(len(line.split()) for line in theirs) < 4, theirs[-3:]
    prefix = next(p for p in (work / "log" / "1").glob("*.index")).with_suffix("")
    logdir = tmp_path / "converted"
    run = run_script("reference.py", "convert", "--ckpt", str(prefix), "--prepro_dir", prepro, "--logdir", str(logdir))
    assert run.returncode == 0, run.stderr[-3000:]

    model, hp = reference.from_reference(str(prefix), prepro, str(tmp_path / "again"))
    compared, differ, left_out = reference.greedy_differences(theirs, model, hp, prepro)
    assert differ == 0 and compared >= left_out, (compared, differ, left_out)
    translated = subprocess.run([sys.executable, "translate.py", "--logdir", str(logdir), "--beam_size", "4"], cwd=ROOT,
                                input="Ein Mann fährt Fahrrad.\n", capture_output=True, text=True, timeout=300)
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr[-3000:]
    exported = run_script("export.py", "--logdir", str(logdir), "--format", "ctranslate2",
                          "--output", str(tmp_path / "ct2"))
    assert exported.returncode == 0, exported.stderr[-3000:]
