"""The benchmarks run, print their summary lines, and measure what they say."""
import json
import os
import re
import shutil
import statistics

import pytest

from conftest import bench_module, run_script


@pytest.mark.slow
def test_benchmarks_run_and_end_with_their_summary_line(quick_start, tmp_path):
    prepro_dir = str(quick_start.prepro)
    train = run_script("bench/train_speed.py", "--preset", "sample", "--steps", "2", "--prepro_dir", prepro_dir,
                       "--yardsticks", "none", "--d_ff", "96")
    assert train.returncode == 0, train.stderr[-2000:]
    assert "d_model 64, d_ff 96, 2+2 blocks" in train.stdout  # the preset at another size
    assert re.fullmatch(r"train_speed preset=sample tgt_tok_s=\d+ mfu=[\d.]+ ref_shaped_tgt_tok_s=\d+ "
                        r"peak_rss_mb=\d+ precision=\w+ mfu_float32=[\d.]+", train.stdout.strip().splitlines()[-1])
    decode = run_script("bench/decode_speed.py", "--preset", "sample", "--sentences", "8", "--length", "5",
                        "--prepro_dir", prepro_dir, "--ctranslate2", "float32")
    assert decode.returncode == 0, decode.stderr[-2000:]
    assert re.fullmatch(r"decode_speed cached_vs_uncached=[\d.]+ beam4_vs_greedy=[\d.]+ greedy_tok_s=\d+ "
                        r"beam4_tok_s=\d+ ct2_greedy_tok_s=\d+ ct2_beam4_tok_s=\d+ ct2_vs_ours_greedy=[\d.]+ "
                        r"ct2_vs_ours_beam4=[\d.]+", decode.stdout.strip().splitlines()[-1])
    assert re.search(r"CTranslate2 float32 greedy .* tok/s", decode.stdout)
    assert "exactly 5 output tokens" in decode.stdout
    # one block a side: the bench builds and traces four models, which is most of its time here
    kernels = run_script("bench/kernel_speed.py", "--preset", "sample", "--steps", "2", "--rounds", "1",
                         "--measure", "dropout", "--sentences", "8", "--num_blocks", "1", "--prepro_dir", prepro_dir,
                         "--record", str(tmp_path / "kernels.json"))
    assert kernels.returncode == 0, kernels.stderr[-2000:]
    record = json.loads((tmp_path / "kernels.json").read_text())
    assert record["kind"] == "kernel_speed" and set(record["figures"]["beam"]) == {"plain", "projections", "beam_cache"}
    assert all(len(t) == 1 for t in record["figures"]["beam_seconds"].values())  # one counted round
    assert re.fullmatch(r"kernel_speed noise=[\d.]+ dropout=[\d.]+/[01] fast=[\d.]+/[01] last_dropout=[\d.]+/[01] "
                        r"adam_update=[\d.]+/[01] beam_projections=[\d.]+/[01] beam_beam_cache=[\d.]+/[01]",
                        kernels.stdout.strip().splitlines()[-1])
    sampling = run_script("bench/sampling_speed.py", "--prepro_dir", prepro_dir, "--epochs", "1")
    assert sampling.returncode == 0, sampling.stderr[-2000:]
    assert re.fullmatch(r"sampling_speed seeded_s=[\d.]+ sentencepiece_s=[\d.]+ ratio=[\d.]+",
                        sampling.stdout.strip().splitlines()[-1])
    bad = run_script("bench/train_speed.py", "--preset", "sample", "--num_heads", "5")
    assert bad.returncode == 2 and "not divisible by num_heads 5" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["keras", "keras_bf16", "torch"])
def test_benchmark_yardsticks_learn(name):
    """The bench's plain Keras and PyTorch models train: their loss on one batch falls."""
    if name == "torch":
        pytest.importorskip("torch", reason="PyTorch is an optional yardstick, not a requirement")
    import dataclasses
    import sys

    import numpy as np

    import hyperparams
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    import yardsticks

    hp = dataclasses.replace(hyperparams.preset("sample"), d_model=32, d_ff=64, num_blocks=1, dropout_rate=0.0)
    rng = np.random.default_rng(0)
    source, target = rng.integers(4, 50, (8, 7)), rng.integers(4, 50, (8, 6))
    source[:4, 5:], target[:4, 4:] = 0, 0  # padding in half the rows
    decoder_in = np.concatenate([np.full((8, 1), 2), target[:, :-1]], axis=1)
    model = yardsticks.build(name, hp, 50, seed=0)
    losses = [float(model.train_on_batch((source, decoder_in), target)) for _ in range(30)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.05, losses


def test_peak_memory_is_the_script_own_not_its_parent():
    """A script started from a process holding 400 MB reports its own peak, and sees its own growth
    (getrusage's ru_maxrss on Linux reported the parent's memory at fork time)."""
    held = bytearray(400 * 2**20)
    held[::4096] = b"\1" * len(held[::4096])  # touch every page
    code = "from support import utils; a = utils.peak_rss_mb(); b = bytearray(300 * 2**20); " \
           "b[::4096] = b'\\1' * len(b[::4096]); print(a, utils.peak_rss_mb())"
    run = run_script("-c", code)
    assert run.returncode == 0, run.stderr[-2000:]
    before, after = map(float, run.stdout.split())
    assert before < 200 and after - before > 250, run.stdout
    del held


def test_iwslt_shaped_pairs_have_the_stated_lengths_and_ids():
    """bench/train_speed.py's synthetic IWSLT 2016 pairs: source lengths of mean about 23, targets
    about 0.95 of their source, every pair under maxlen with room for </s>, ids past the specials."""
    import sys

    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    from train_speed import iwslt_like

    src, tgt = iwslt_like(50, seed=0, pairs=20000, maxlen=100)
    src_lens, tgt_lens = np.array([len(s) for s in src]), np.array([len(t) for t in tgt])
    assert len(src) == len(tgt) == 20000 and 22 < src_lens.mean() < 24
    assert 0.9 < np.median(tgt_lens / src_lens) < 1.0
    assert src_lens.min() >= 1 and max(src_lens.max(), tgt_lens.max()) <= 99
    ids = np.concatenate(src + tgt)
    assert ids.dtype == np.int32 and ids.min() >= 4 and ids.max() < 50


def test_time_to_quality_reads_each_runs_clock_and_dev_bleu(quick_start, tmp_path):
    """bench/time_to_quality.py on the quick start's run (a real one: the sample preset trained) and
    a copy of it resumed once (a second process's clock): the minutes to each threshold and in all,
    the epochs and the last dev BLEU are those of the runs' history.jsonl, and eval.py's dev result,
    where the run has one."""
    import json
    import shutil

    from support.pictures import read_history

    history = read_history(quick_start.log / "history.jsonl")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(quick_start.log / "hparams.json", resumed)
    # the same epochs, its second half trained by a second process whose clock started again
    half = len(history) // 2
    offset = history[half - 1]["elapsed_seconds"]
    with open(resumed / "history.jsonl", "w", encoding="utf-8") as f:
        for k, h in enumerate(history):
            f.write(json.dumps(dict(h, elapsed_seconds=h["elapsed_seconds"] - (offset if k >= half else 0))) + "\n")
    low, high = history[0]["dev_bleu"] + 0.01, max(h["dev_bleu"] for h in history)
    first = next(h for h in history if h["dev_bleu"] >= low)
    record = tmp_path / "ttq.json"
    run = run_script("bench/time_to_quality.py", str(quick_start.log), str(resumed), "--labels", "sample",
                     "resumed", "--thresholds", f"{low},{high},1000", "--record", str(record))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("Machine: ") and "bfloat16 instructions" in run.stdout and "AMX" in run.stdout
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in run.stdout.splitlines() if line.startswith("| ")}
    total = history[-1]["elapsed_seconds"] / 60
    assert rows["sample"][1] in ("float32", "mixed_bfloat16")  # as train.py recorded it
    assert rows["sample"][2:5] == [str(len(history)), f"{total:.1f}", f"{first['elapsed_seconds'] / 60:.1f}"]
    assert rows["sample"][6] == "not reached" and rows["sample"][7] == f"{history[-1]['dev_bleu']:.2f}"
    assert rows["resumed"][3] == f"{total:.1f}"  # the two processes' clocks added
    assert rows["resumed"][4] == rows["sample"][4] and rows["resumed"][5] == rows["sample"][5]
    assert rows["sample"][8].startswith("dev_") or rows["sample"][8] == "not run |"
    assert rows["resumed"][8] == "not run |"
    # the record holds the same figures, and bench/tables.py draws them as results.md's table
    from support import records
    tables = bench_module("tables")
    kept = dict(records.read(record), file="ttq.json")
    assert kept["kind"] == "time_to_quality" and [r["label"] for r in kept["figures"]["runs"]] == ["sample", "resumed"]
    drawn = {line.split(" | ")[0][2:]: line.split(" | ") for line in
             tables.time_to_quality([kept], tables.WORDS["en"]).splitlines()[2:]}
    assert drawn["resumed"][5] == rows["sample"][3] and drawn["resumed"][7] == rows["sample"][7]
    assert drawn["sample"][6].startswith(f"{low:g}: {rows['sample'][4]} · ") and drawn["sample"][6].endswith(
        "1000: not reached")
    bad = run_script("bench/time_to_quality.py", str(tmp_path / "none"))
    assert bad.returncode == 2 and "history.jsonl" in bad.stderr


@pytest.mark.slow
def test_decode_speed_takes_a_run_trained_in_bfloat16(quick_start, tmp_path):
    """bench/decode_speed.py --ckpt of a run trained in mixed bfloat16 (forced, so on any CPU):
    CTranslate2's conversion is checked against the run's float32 twin, as export.py's is, and the
    bench prints its summary line."""
    import glob

    logdir = tmp_path / "bf16"
    train = run_script("train.py", "--prepro_dir", str(quick_start.prepro), "--logdir", str(logdir), "--num_epochs",
                       "1", "--precision", "mixed_bfloat16", "--eval_sentences", "3", "--d_model", "32", "--d_ff",
                       "64", "--num_blocks", "1", "--num_heads", "2")
    assert train.returncode == 0, train.stderr[-2000:]
    assert "precision mixed_bfloat16" in train.stdout
    (ckpt,) = glob.glob(str(logdir / "ckpt" / "*.keras"))
    decode = run_script("bench/decode_speed.py", "--preset", "sample", "--sentences", "8", "--prepro_dir",
                        str(quick_start.prepro), "--ckpt", ckpt, "--ctranslate2", "float32")
    assert decode.returncode == 0, decode.stderr[-2000:]
    assert decode.stdout.strip().splitlines()[-1].startswith("decode_speed cached_vs_uncached=")


@pytest.mark.slow
def test_translate_speed_times_the_users_path_beside_ctranslate2(quick_start, tmp_path):
    """bench/translate_speed.py on the quick start's run and a file of its test sentences: the first
    and second passes of each search, ours and CTranslate2's, their ratios, the lines alike (greedy: all
    of them, the same model decoded elsewhere), and its summary line; a file it cannot read, one line."""
    pytest.importorskip("ctranslate2")
    source = tmp_path / "in.de"
    lines = (quick_start.prepro / "test.de").read_text(encoding="utf-8").splitlines()[:12]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = run_script("bench/translate_speed.py", "--logdir", str(quick_start.log), "--input", str(source),
                     "--beam_sizes", "1,2", "--repeats", "2", "--record", str(tmp_path / "speed.json"))
    assert run.returncode == 0, run.stderr[-2000:]
    # the second passes, two of each, alternating: each printed and recorded, their medians in the table
    assert len(re.findall(r"^  second passes, ours: [\d.]+, [\d.]+ s; CTranslate2's: [\d.]+, [\d.]+ s \(medians in "
                          r"the table\)$", run.stdout, re.M)) == 2, run.stdout
    figures = json.loads((tmp_path / "speed.json").read_text(encoding="utf-8"))["figures"]
    assert figures["repeats"] == 2 and [s["beam_size"] for s in figures["searches"]] == [1, 2]
    for search in figures["searches"]:
        assert len(search["ours_again_each_s"]) == len(search["ct2_again_each_s"]) == 2
        for who in ("ours", "ct2"):  # the median of the passes (each rounded as recorded)
            assert abs(search[f"{who}_again_s"] - statistics.median(search[f"{who}_again_each_s"])) <= 0.011
    assert re.search(r"; decoding loops (compiled by XLA for each batch shape|run as one graph for every batch shape);",
                     run.stdout), run.stdout  # as the run's --jit_compile says
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith("| greedy") or
            line.startswith("| beam 2")]
    assert len(rows) == 2 and rows[0][-1] == "12 of 12 |", run.stdout
    assert re.search(r"^greedy: \d+ batches in \d+ shapes \(rows x source length\), \d+% of their source tokens "
                     r"padding; rows x steps [\d.]+ times the tokens written$", run.stdout, re.M), run.stdout
    assert re.search(r"^beam 2: \d+ batches in \d+ shapes", run.stdout, re.M), run.stdout
    assert float(re.search(r"rows x steps ([\d.]+) times", run.stdout).group(1)) >= 1  # never fewer than written
    searches = r"^(greedy|beam 2): (\d+) batches in (\d+) shapes.*\n((?:  .*\n)*)"
    for search, batches, shapes, timed in re.findall(searches, run.stdout, re.M):  # each shape's seconds, each pass
        found = re.findall(r"^  \d+ x \d+: (\d+) batch(?:es)?, first pass ([\d.]+) s, again ([\d.]+) s, first pass's "
                           r"excess (-?[\d.]+) s$", timed, re.M)
        assert len(found) == int(shapes) and sum(int(f[0]) for f in found) == int(batches), (search, timed)
        assert all(abs(float(first) - float(again) - float(excess)) < 0.015 for _, first, again, excess in found)
    for row in rows:  # seconds and ratios (of the unrounded seconds), which may round to 0.00
        assert all(float(cell) >= 0 for cell in row[1:7]), row
    assert re.fullmatch(r"translate_speed greedy_first_vs_ct2=[\d.]+ greedy_steady_vs_ct2=[\d.]+ "
                        r"beam_first_vs_ct2=[\d.]+ beam_steady_vs_ct2=[\d.]+", run.stdout.strip().splitlines()[-1])
    bad = run_script("bench/translate_speed.py", "--logdir", str(quick_start.log), "--input", str(tmp_path / "none"))
    assert bad.returncode == 2 and "--input" in bad.stderr and "cannot be read" in bad.stderr
    bad = run_script("bench/translate_speed.py", "--logdir", str(quick_start.log), "--input", str(source),
                     "--repeats", "0")
    assert bad.returncode == 2 and "--repeats 0: give 1 or more" in bad.stderr
    # from a copy of the run's own compilation cache (the quick start's, beside its run), and without one
    cached = run_script("bench/translate_speed.py", "--logdir", str(quick_start.log), "--input", str(source),
                        "--beam_sizes", "1", "--cache", "run", "--jit_compile", "on")
    assert cached.returncode == 0 and (quick_start.log.parent / "compile_cache").is_dir(), cached.stderr[-2000:]
    assert "decoding loops compiled by XLA for each batch shape" in cached.stdout, cached.stdout
    alone = tmp_path / "alone" / "sample"
    shutil.copytree(quick_start.log, alone)
    none = run_script("bench/translate_speed.py", "--logdir", str(alone), "--input", str(source), "--cache", "run")
    assert none.returncode == 2 and "no compilation cache" in none.stderr, none.stderr[-2000:]
