"""End to end: the quick start (prepro -> train -> eval on corpora/sample), resuming, eval's output,
and the one-line errors of the scripts."""
import json
import os
import re

import pytest

from conftest import SHARED, assert_one_line_error, run_script


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory):
    """The README's quick start, with its outputs in a temporary folder."""
    tmp = tmp_path_factory.mktemp("quick_start")
    dirs = ["--prepro_dir", str(tmp / "prepro"), "--logdir", str(tmp / "log")]
    runs = [run_script("prepro.py", "--preset", "sample", *dirs),
            run_script("train.py", "--preset", "sample", *dirs),
            run_script("eval.py", "--preset", "sample", *dirs)]
    return tmp, dirs, runs


def test_quick_start_end_to_end(quick_start):
    tmp, _, (prepro, train, evaluation) = quick_start
    for run in (prepro, train, evaluation):
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "split train: 500 pairs" in prepro.stdout
    history = [json.loads(line) for line in open(tmp / "log" / "history.jsonl")]
    assert [h["epoch"] for h in history] == list(range(1, 31))
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 2
    assert history[-1]["dev_bleu"] > 20  # the sample is learnable: a broken model stays near 0
    ckpts = os.listdir(tmp / "log" / "ckpt")
    assert len(ckpts) == 5 and all(re.fullmatch(r"E\d\dL\d+\.\d\dB\d+\.\d\d\.keras", c) for c in ckpts)
    assert os.listdir(tmp / "log" / "tensorboard")
    last = evaluation.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("BLEU test sacreBLEU = ") and "tok:13a" in last[0]
    assert last[1].startswith("BLEU test reference's way (multi-bleu, whitespace tokens) = ")
    results = os.listdir(tmp / "log" / "results")
    text = open(tmp / "log" / "results" / results[0], encoding="utf-8").read()
    assert text.count("- source: ") == text.count("- got: ") == 50
    assert text.rstrip().splitlines()[-2:] == last  # the scores end the results file


def test_training_resumes_from_the_newest_checkpoint(quick_start):
    tmp, dirs, _ = quick_start
    step = json.loads(open(tmp / "log" / "history.jsonl").readlines()[-1])["step"]
    again = run_script("train.py", "--preset", "sample", *dirs, "--num_epochs", "31")
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(rf"resuming from .*E30L.*\.keras: epoch 30 done, step {step}\b", again.stdout)
    last = json.loads(open(tmp / "log" / "history.jsonl").readlines()[-1])
    assert last["epoch"] == 31 and last["step"] > step
    done = run_script("train.py", "--preset", "sample", *dirs, "--num_epochs", "31")
    assert done.returncode == 0 and "nothing to do" in done.stdout


def test_eval_errors_are_one_line(quick_start, tmp_path):
    tmp, dirs, _ = quick_start
    os.makedirs(tmp_path / "empty")
    import hyperparams
    hyperparams.save_hparams(hyperparams.preset("sample"), str(tmp_path / "empty"))
    none = run_script("eval.py", "--logdir", str(tmp_path / "empty"))
    assert none.returncode == 2 and "Traceback" not in none.stderr
    assert "no checkpoint; train first" in none.stderr and len(none.stderr.strip().splitlines()) == 1
    wrong = run_script("eval.py", *dirs, "--d_model", "32")
    assert wrong.returncode == 2 and "checkpoint of a different model: d_model 64 (settings say 32)" in wrong.stderr
    mixed = run_script("train.py", *dirs, "--d_model", "32")
    assert mixed.returncode == 2 and "holds a run with other settings" in mixed.stderr


def test_reference_outputs_score_as_published():
    """Our scoring, on the reference's own tst2013/tst2014 translations, gives its published figures."""
    data = os.path.join(SHARED, "data")
    if not os.path.isdir(data):
        pytest.skip("../shared is not beside the project")
    import prepro
    import scoring

    cases = (("iwslt2016_E19L2.64B28.06", "tst2013", 28.06, 33.07),
             ("iwslt2016_E19L2.64-29146B23.88", "tst2014", 23.88, 27.84))
    for name, tst, reference_way, sacre in cases:
        hyps = scoring.read_hypotheses(os.path.join(data, "reference-outputs", name))
        xml = os.path.join(data, "iwslt2017-en-de", f"IWSLT17.TED.{tst}.en-de.{{}}.xml")
        _, refs = prepro.read_iwslt_pair(xml.format("de"), xml.format("en"))
        scores = scoring.bleu_scores(hyps, refs)
        assert round(scores["reference"], 2) == reference_way
        assert round(scores["sacrebleu"], 2) == sacre


def test_translate_round_trip(quick_start, tmp_path):
    """stdin -> stdout on the sample model: one line out per line in, empty lines kept."""
    import subprocess
    import sys

    from conftest import ROOT
    tmp, dirs, _ = quick_start
    text = "Ein Mann fährt Fahrrad.\n\nDie Frau trinkt Kaffee.\n"
    run = subprocess.run([sys.executable, "translate.py", *dirs], input=text, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.split("\n")
    assert len(lines) == 4 and lines[3] == ""  # three lines, each ended by a newline
    assert lines[0] and lines[1] == "" and lines[2]
    # a file in, a file out, beam search, and a line longer than maxlen1 split with a note
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

    import decoding
    sp = spm.SentencePieceProcessor(model_file=str(quick_start[0] / "prepro" / "bpe.model"))
    text = "Der Hund schläft im Garten. " * 10 + "Einsehrlangeswortohneende" * 3
    pieces = decoding.split_long(sp, text.strip(), 12)
    assert all(len(p) <= 12 for p in pieces)
    assert sp.decode([i for p in pieces for i in p]).replace(" ", "") == text.replace(" ", "")


def test_eval_beam_search_and_checkpoint_averaging(quick_start):
    tmp, dirs, _ = quick_start
    run = run_script("eval.py", *dirs, "--beam_size", "4", "--average_last", "3")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mean of the newest 3" in run.stdout
    assert run.stdout.strip().splitlines()[-1].endswith(", beam 4, alpha 0.6")
    too_many = run_script("eval.py", *dirs, "--average_last", "9")
    assert too_many.returncode == 2 and "only 5 checkpoints" in too_many.stderr


def test_benchmarks_run_and_end_with_their_summary_line(quick_start):
    tmp, _, _ = quick_start
    prepro_dir = str(tmp / "prepro")
    train = run_script("bench/train_speed.py", "--preset", "sample", "--steps", "2", "--prepro_dir", prepro_dir,
                       "--yardsticks", "none", "--d_ff", "96")
    assert train.returncode == 0, train.stderr[-2000:]
    assert "d_model 64, d_ff 96, 2+2 blocks" in train.stdout  # the preset at another size
    assert re.fullmatch(r"train_speed preset=sample tgt_tok_s=\d+ mfu=[\d.]+ ref_shaped_tgt_tok_s=\d+ "
                        r"peak_rss_mb=\d+ precision=\w+ mfu_float32=[\d.]+", train.stdout.strip().splitlines()[-1])
    decode = run_script("bench/decode_speed.py", "--preset", "sample", "--sentences", "8", "--length", "5",
                        "--prepro_dir", prepro_dir)
    assert decode.returncode == 0, decode.stderr[-2000:]
    assert re.fullmatch(r"decode_speed cached_vs_uncached=[\d.]+ beam4_vs_greedy=[\d.]+ greedy_tok_s=\d+ "
                        r"beam4_tok_s=\d+", decode.stdout.strip().splitlines()[-1])
    assert "exactly 5 output tokens" in decode.stdout
    bad = run_script("bench/train_speed.py", "--preset", "sample", "--num_heads", "5")
    assert bad.returncode == 2 and "not divisible by num_heads 5" in bad.stderr


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
    code = "import utils; a = utils.peak_rss_mb(); b = bytearray(300 * 2**20); b[::4096] = b'\\1' * len(b[::4096]); " \
           "print(a, utils.peak_rss_mb())"
    run = run_script("-c", code)
    assert run.returncode == 0, run.stderr[-2000:]
    before, after = map(float, run.stdout.split())
    assert before < 200 and after - before > 250, run.stdout
    del held


def test_very_long_lines_translate_in_bounded_memory(quick_start, tmp_path):
    """Lines of thousands of tokens: cut into pieces the model can take, batched by tokens."""
    tmp, dirs, _ = quick_start
    long_line = "Der Hund schläft im Garten, und die Katze spielt mit einem Ball. " * 300  # ~6000 tokens
    (tmp_path / "long.de").write_text("Ein Mann fährt Fahrrad.\n" + (long_line + "\n") * 5, encoding="utf-8")
    measure = ("import runpy, sys, utils; sys.argv = ['translate.py'] + sys.argv[1:]\n"
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


def test_average_last_is_the_element_wise_mean_of_the_newest_checkpoints(quick_start):
    import numpy as np

    import checkpoints
    import eval as evaluation
    import hyperparams
    tmp, _, _ = quick_start
    hp = hyperparams.load_hparams(str(tmp / "log"))
    model, _, name = evaluation.load_trained(hp, average_last=3)
    paths = [path for _, path in checkpoints.epoch_checkpoints(hp.logdir)[-3:]]
    each = [checkpoints.load(path, hp).get_weights() for path in paths]
    got = model.get_weights()
    assert len(got) == len(each[0]) > 40
    for mean, *weights in zip(got, *each):
        np.testing.assert_allclose(mean, np.mean(weights, axis=0), rtol=1e-6, atol=1e-7)
    assert not all(np.array_equal(a, b) for a, b in zip(got, each[-1]))  # not simply the newest
    assert name == paths[-1][:-len(".keras")] + "_avg3.keras"


def test_a_damaged_checkpoint_is_a_one_line_error(quick_start, tmp_path):
    tmp, dirs, _ = quick_start
    newest = sorted(os.listdir(tmp / "log" / "ckpt"))[-1]
    data = (tmp / "log" / "ckpt" / newest).read_bytes()
    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(data[:len(data) // 2])
    run = run_script("eval.py", *dirs, "--ckpt", str(damaged))
    assert_one_line_error(run, rf"{re.escape(str(damaged))}: cannot load this checkpoint")


def test_an_id_beyond_the_vocabulary_is_a_one_line_error(quick_start, tmp_path):
    import shutil

    import numpy as np
    tmp, _, _ = quick_start
    prepro_dir = tmp_path / "prepro"
    shutil.copytree(tmp / "prepro", prepro_dir)
    vocab_size = json.loads((prepro_dir / "meta.json").read_text())["vocab_size"]
    with np.load(prepro_dir / "train.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["tgt_ids"][7] = vocab_size
    np.savez(prepro_dir / "train.npz", **arrays)
    run = run_script("train.py", "--prepro_dir", str(prepro_dir), "--logdir", str(tmp_path / "log"))
    assert_one_line_error(run, rf"{re.escape(str(prepro_dir / 'train.npz'))}: tgt_ids holds id {vocab_size} "
                               rf"but the vocabulary has {vocab_size}")


def test_stdin_that_is_not_utf8_is_a_one_line_error_naming_the_line(quick_start):
    import subprocess
    import sys

    from conftest import ROOT
    _, dirs, _ = quick_start
    run = subprocess.run([sys.executable, "translate.py", *dirs], input=b"Ein Hund.\nZwei \xff Katzen.\n", cwd=ROOT,
                         capture_output=True, timeout=300)
    run.stderr = run.stderr.decode("utf-8")
    assert_one_line_error(run, r"<stdin>:2: bytes that are not UTF-8")
    assert run.stdout == b"" and len(run.stderr.strip().splitlines()) == 1  # before Keras loads: nothing else


def test_a_broken_hparams_json_is_a_one_line_error_naming_the_line(tmp_path):
    logdir = tmp_path / "log"
    os.makedirs(logdir)
    (logdir / "hparams.json").write_text('{\n  "d_model": 64,\n  "d_ff"\n}\n', encoding="utf-8")
    run = run_script("eval.py", "--logdir", str(logdir))
    assert_one_line_error(run, rf"{re.escape(str(logdir / 'hparams.json'))}: not valid JSON \(.*line 4 column 1\b")
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_broken_tf_config_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    env = dict(os.environ, TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1"]}, "task": ')
    run = subprocess.run([sys.executable, "train.py", "--logdir", str(tmp_path / "log"), "--prepro_dir",
                          str(tmp_path / "none")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert_one_line_error(run, r"TF_CONFIG is not a valid cluster description \(.*line 1 column \d+")
