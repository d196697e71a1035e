"""ablate.py's bookkeeping on the sample preset, one epoch a run: an interrupted run resumes, the
table and its picture are written (a section written by hand below it kept), and a second call
trains and evaluates nothing again."""
import json
import os
import re
import signal

import pytest

from ablate import wall_seconds
from conftest import run_script

# one epoch of the sample in 24 batches, a checkpoint every 5 steps (one to resume from)
EXTRA = ["--num_epochs", "1", "--tokens_per_batch", "256", "--save_every_steps", "5", "--eval_sentences", "5"]


@pytest.mark.slow
def test_ablate_resumes_skips_what_is_done_and_writes_the_table(quick_start, tmp_path):
    runs, table = tmp_path / "runs", tmp_path / "ablations.md"
    common = ["--preset", "sample", "--only", "pre_norm", "--seeds", "1", "--runs", str(runs), "--output", str(table),
              *EXTRA, "--prepro_dir", str(quick_start.prepro)]
    interrupted = runs / "pre_norm" / "seed1"
    killed = run_script("tests/interrupted_train.py", "10", "train.py", "--preset", "sample", "--logdir",
                        str(interrupted), "--seed", "1", "--norm", "pre", *EXTRA,
                        "--prepro_dir", str(quick_start.prepro))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first = run_script("ablate.py", *common)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "resuming from" in first.stdout and "epoch 2, batch" not in first.stdout
    text = table.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| preset") or line.startswith("| pre_norm")]
    assert len(rows) == 2 and "`--norm pre`" in rows[1] and "the baseline" in rows[0]
    assert rows[1].split("|")[-2].strip() == "one seed: no spread to judge by yet"
    assert "ablations.png" in text and (tmp_path / "ablations.png").stat().st_size > 1000
    assert re.search(r"CPU family \S+, \d+ cores, with(out)? bfloat16 instructions\), in "
                     r"(float32|mixed_bfloat16)\.", text), text[:2000]
    scores = json.loads((interrupted / "ablation.json").read_text())
    assert scores["epochs"] == 1 and "as trained" in scores["beam"]
    again = run_script("ablate.py", *common)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "train.py" not in again.stdout and "BLEU dev" not in again.stdout  # nothing trained or scored
    assert json.loads((interrupted / "ablation.json").read_text()) == scores
    assert os.path.getsize(table) > 0
    own = "## Written by hand\n\nKept when the table is written again.\n"
    table.write_text(table.read_text(encoding="utf-8") + "\n" + own, encoding="utf-8")
    report = run_script("ablate.py", *common[:3], "pre_norm,no_positions", *common[4:], "--report")
    assert report.returncode == 0, report.stderr[-3000:]
    assert "train.py" not in report.stdout and "not trained yet" in report.stdout
    text = table.read_text(encoding="utf-8")
    assert "| pre_norm |" in text and "| no_positions |" not in text
    assert "Runs not finished yet: 1 of 3;" in text and "python ablate.py --preset sample --only" in text
    assert text.endswith("|\n\n" + own) and text.count("## Written by hand") == 1  # the document's own section
    bad = run_script("ablate.py", "--only", "no_such_row", "--runs", str(runs))
    assert bad.returncode == 2 and "unknown variant no_such_row" in bad.stderr


def test_wall_seconds_adds_the_clocks_of_a_resumed_run():
    # train.py's elapsed_seconds restarts with each process: epochs 1-2, then a resume for 3-4
    history = [{"elapsed_seconds": t} for t in (60.0, 120.0, 70.0, 130.0)]
    assert wall_seconds(history) == 250.0
