"""The port computes the reference's numbers: Kyubyong Park's own code (commit fb023bb), run unedited
by reference.py in a process of its own, against the port given the same weights (converted by
reference.py convert). Skipped, with the reason, where the reference's files or tf_keras are missing."""
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import data_load
from reference_bridge import curves as experiment  # the curves experiment
from reference_bridge import report, weights
from support.utils import UserError
from conftest import ROOT, assert_one_line_error, run_script

CODE = os.path.join(os.path.dirname(ROOT), "shared", "reference", "kyubyong-transformer-fb023bb")


def runs_the_reference(test):
    """The marks of a test that runs the reference's code: slow, and skipped, with the reason,
    where its files or tf_keras are missing."""
    for mark in (pytest.mark.slow,
                 pytest.mark.skipif(not os.path.isfile(os.path.join(CODE, "train.py")),
                                    reason=f"the reference's files are not at {CODE}"),
                 pytest.mark.skipif(__import__("importlib").util.find_spec("tf_keras") is None,
                                    reason="tf_keras is not installed (bash setup.sh dev)")):
        test = mark(test)
    return test


@runs_the_reference
def test_the_port_computes_the_references_numbers(quick_start, tmp_path):
    """reference.py check: the reference's own code and the port from the same random weights agree
    at both sizes, with the plain kernels and the fast ones (--kernels auto): on the logits and a
    layer normalization (1e-5), on the loss (1e-5) and the weights (all but 0.1% within 1e-5, every
    one within 1e-3) after each of five training steps with each side's own optimizer and schedule,
    on the key biases (1e-3), on dropout's means and variance over 400 draws, on the reference's own
    data_load batches entry for entry, on greedy dev translations line for line (the reference's
    test.py restoring the port's weights; the port's uncached and cached greedy decoding and beam
    search of beam 1), and on multi-bleu.perl's BLEU (0.01); and the steps moved the weights far
    beyond the tolerance."""
    run = run_script("reference.py", "check", "--reference_dir", CODE, "--prepro_dir", str(quick_start.prepro),
                     "--workdir", str(tmp_path / "check"), timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    printed = run.stdout[run.stdout.index("The reference's code (commit fb023bb)"):].splitlines()
    rows = printed[1:-1]
    kernels, decodings, sizes = len(report.KERNELS), len(report.DECODINGS), len(report.CHECK_SIZES)
    # per kernels: logits, layer norm, 5 x (loss, weights), largest weight, key biases, moved, 2 dropout
    assert len(rows) == sizes * (kernels * (2 + 2 * 5 + 3 + 2) + 1 + kernels * decodings) + 1, printed
    assert all(line.startswith("ok   ") for line in rows), printed
    for size in ("d_model 16, 2 heads, 2+2 blocks", "d_model 64, 4 heads, 3+3 blocks"):
        for choice in ("plain", "auto"):  # every decoding path with either kernels, against the reference's greedy
            for path in report.DECODINGS:
                assert f"ok   [{size}] --kernels {choice}, {path} translations of dev" in run.stdout
            dropout = f"ok   [{size}] --kernels {choice}: dropout 0.3, the first batch's logits over 400 draws"
            assert dropout in run.stdout
        assert f"ok   [{size}] its data_load's batches of the training files" in run.stdout
    assert printed[-1] == f"{len(rows)} of {len(rows)} agree: the port computes the reference's numbers"
    moved = re.findall(r"moved the weights by \(largest change\): ([\d.e-]+)", run.stdout)
    assert len(moved) == sizes * kernels and min(map(float, moved)) > 1e-2
    compared = re.search(r"lines that differ from its greedy ones, of the (\d+) compared \((\d+) words; (\d+) up to",
                         run.stdout)
    dev = data_load.load_text(str(quick_start.prepro), "dev", "en")
    assert int(compared.group(1)) == len(dev) and int(compared.group(2)) >= len(dev), printed  # a word a line or more
    kept = re.search(r"it keeps (\d+) of (\d+) pairs, the port (\d+)", run.stdout)
    assert 0 < int(kept.group(1)) == int(kept.group(3)) < int(kept.group(2)), printed  # the filter dropped pairs


def test_a_line_where_the_reference_chose_pad_or_bos_is_compared_up_to_there():
    """compare_line: a whole line must be equal; where the reference's argmax chose <pad> or <s> (the
    port's never does), the port's line must begin with what came before, and only that counts."""
    assert report.compare_line("a man rides", "a man rides") == (False, False, 3)
    assert report.compare_line("a man rides", "a man rides a bike") == (True, False, 3)
    assert report.compare_line("a man<pad><pad>", "a man rides") == (False, True, 2)
    assert report.compare_line("a man <s><s>", "a man") == (False, True, 2)
    assert report.compare_line("a dog<s>", "a man rides") == (True, True, 2)
    assert report.compare_line("<s><s><s>", "girl cat") == (False, True, 0)


def test_the_curves_table_gives_each_sides_means_and_spread_at_the_last_epoch():
    """curves_table on made-up runs: the per-epoch means, the last epoch run by run, and a verdict
    with each side's mean, its runs' figures and the largest spread, in both metrics."""
    def run(losses, bleus, multi=None):
        return [dict(epoch=e, train_loss=loss, dev_bleu=bleu, dev_bleu_reference=bleu - 3, multi_bleu=multi)
                for e, (loss, bleu) in enumerate(zip(losses, bleus), 1)]

    table = experiment.curves_table([run([5.0, 4.0], [10.0, 20.0], 17.0), run([5.2, 4.2], [11.0, 21.0], 18.0)],
                                   [run([5.1, 4.1], [10.0, 23.0]), run([5.3, 4.3], [12.0, 24.0])])
    assert "| 1 | 5.10 | 5.20 | 10.50 | 11.00 | 7.50 | 8.00 |" in table
    assert "| 2 | 4.10 | 4.20 | 20.50 | 23.50 | 17.50 | 20.50 |" in table
    assert "| reference run 2 | 2 | 21.00 | 18.00 | 18.00 |" in table
    assert "| port seed 1 | 2 | 23.00 | 20.00 |  |" in table  # no multi-bleu.perl on the port's side
    assert ("sacreBLEU: the reference 20.50 (runs 20.00, 21.00), the port 23.50 (seeds 23.00, 24.00), a difference of "
            "+3.00 against runs that differ among themselves by up to 1.00") in table
    assert "With 2 runs a side" in table
    alone = experiment.curves_table([run([5.0], [10.0])], [run([5.1], [12.0]), run([5.3], [13.0])])
    assert ("a difference of +2.50; the port's seeds differ by 1.00, the other side's one run has no spread to "
            "measure" in alone and "differ among themselves" not in alone)  # one run: no spread, not a spread of 0
    assert "One run on one side: nothing here can be told" in alone
    one_each = experiment.curves_table([run([5.0], [10.0])], [run([5.1], [12.0])])
    assert "+2.00, with one run on a side: nothing to measure" in one_each and "One run a side: nothing" in one_each


def test_curves_draw_joins_runs_by_their_history_files_and_trains_nothing(tmp_path):
    """curves --draw: a reference run with a finished history.jsonl and no logs (a run made on
    another machine) and port seeds of 2 and 1 epochs are drawn as far as they go, the verdict
    saying the runs have not all reached the same epoch; nothing is trained or written but the
    picture and the table. With no run of one side, a one-line error names the folder."""
    def write(path, epochs, **extra):
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(dict(epoch=e, train_loss=6.0 - e, dev_bleu=10.0 * e,
                                                dev_bleu_reference=10.0 * e - 1, **extra)) + "\n"
                                for e in range(1, epochs + 1)), encoding="utf-8")

    work = tmp_path / "work"
    write(work / "reference" / "run1" / "history.jsonl", 20, multi_bleu=1.0)
    write(work / "port" / "seed1" / "history.jsonl", 2)
    write(work / "port" / "seed2" / "history.jsonl", 1)
    run = run_script("reference.py", "curves", "--draw", "--workdir", str(work))
    assert run.returncode == 0, run.stderr[-3000:]
    table = (work / "curves.md").read_text(encoding="utf-8")
    assert "| 2 | 4.00 | 4.00 | 20.00 | 20.00 | 19.00 | 19.00 |" in table and "| port seed 2 | 1 | 10.00 |" in table
    assert "at each run's last epoch so far (the runs have not all reached the same epoch)" in table
    assert "the port 15.00 (seeds 20.00, 10.00)" in table and "settings given to both" not in table
    assert sorted(p.name for p in work.iterdir()) == ["curves.md", "curves.png", "port", "reference"]
    assert (work / "curves.png").stat().st_size > 10000
    empty = tmp_path / "empty"
    write(empty / "reference" / "run1" / "history.jsonl", 3)
    assert_one_line_error(run_script("reference.py", "curves", "--draw", "--workdir", str(empty)),
                          rf"{re.escape(str(empty))}: no epoch of the port to draw yet")
    run = run_script("reference.py", "curves", "--workdir", str(empty))
    assert run.returncode == 2 and "curves needs --prepro_dir" in run.stderr, run.stderr[-2000:]


def test_curves_stops_before_any_training_when_the_equality_report_fails(quick_start, tmp_path, monkeypatch):
    """curves first runs the equality report on the ids it trains on; a row that fails stops it
    before any training, with the report's folder named: the curves would compare two programs."""
    failing = report.within("logits", 2e-5, report.TOLERANCE)
    monkeypatch.setattr(report, "check", lambda code, prepro_dir, workdir: [failing])
    trained = []
    monkeypatch.setattr(experiment, "train_reference", lambda *args: trained.append(args))
    work = tmp_path / "work"
    with pytest.raises(UserError, match="do not compute the same numbers on .*the report above"):
        experiment.curves(None, str(quick_start.prepro), str(work), 1, [])
    assert not trained and not (work / "reference").exists() and not (work / "port").exists()


def test_the_documents_curves_are_drawn_from_the_runs_records(tmp_path):
    """docs/reference_curves/curves.md is what `reference.py curves --draw` makes of the runs'
    history.jsonl files beside it: the table in the documents comes from the records, unedited."""
    records = os.path.join(ROOT, "docs", "reference_curves")
    work = tmp_path / "reference_curves"
    shutil.copytree(records, work, ignore=shutil.ignore_patterns("curves.*"))
    run = run_script("reference.py", "curves", "--draw", "--workdir", str(work))
    assert run.returncode == 0, run.stderr[-3000:]
    with open(os.path.join(records, "curves.md"), encoding="utf-8") as f:
        assert (work / "curves.md").read_text(encoding="utf-8") == f.read()
    assert os.path.isfile(os.path.join(records, "curves.png"))


def test_a_reference_run_is_read_from_its_own_summaries_and_translation_files(quick_start, tmp_path):
    """reference_history: each epoch's training loss is the mean of the per-step losses of its
    summaries (a last record cut short, as a run stopped or still writing leaves it, ends the file),
    its dev BLEU the translation file's, scored both ways, beside the multi-bleu.perl line appended to it."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    run = tmp_path / "run"
    (run / "log" / "1").mkdir(parents=True)
    (run / "eval" / "1").mkdir(parents=True)
    (tmp_path / "train.bpe").write_text("x\n" * 10)  # 10 pairs in batches of 4: 3 steps an epoch
    (run / "log" / "1" / "hparams").write_text(json.dumps(dict(train1=str(tmp_path / "train.bpe"), batch_size=4,
                                                              num_epochs=3)))
    events = run / "log" / "1" / "events.out.tfevents.1.host"
    with tf.io.TFRecordWriter(str(events)) as writer:
        for step, loss in enumerate([9.0, 8.0, 7.0, 6.0, 5.0, 1.0], 1):
            event = event_pb2.Event(step=step)
            event.summary.value.add(tag="loss", simple_value=loss)
            event.summary.value.add(tag="lr", simple_value=0.1)
            writer.write(event.SerializeToString())
    events.write_bytes(events.read_bytes()[:-3])  # step 6's record cut short
    references = data_load.load_text(str(quick_start.prepro), "dev", "en")
    (run / "eval" / "1" / "iwslt2016_E01L8.00B100.00").write_text("\n".join(references) + "\nBLEU = 100.00, "
                                                                  "100.0/100.0/100.0/100.0 (BP=1.000, ration=1.000)\n")
    (run / "eval" / "1" / "iwslt2016_E02L6.00").write_text("\n".join(references[:1] + ["x"] * 49) + "\n")
    history = experiment.reference_history(str(run), str(quick_start.prepro))
    assert [e["epoch"] for e in history] == [1, 2]  # no file for epoch 3
    assert history[0]["train_loss"] == 8.0 and history[1]["train_loss"] == 5.5  # steps 4 and 5 read
    assert history[0]["multi_bleu"] == 100.0 and abs(history[0]["dev_bleu"] - 100) < 1e-9
    assert abs(history[0]["dev_bleu_reference"] - 100) < 1e-9
    assert history[1]["dev_bleu"] < 10 and history[1]["multi_bleu"] is None  # no line appended


def test_a_failed_comparison_is_reported_and_fails_the_check():
    """A row beyond its bound is printed FAIL and not ok (the check exits 1 on one)."""
    assert not report.within("x", 2e-5, report.TOLERANCE).ok
    assert report.within("x", 2e-5, report.TOLERANCE).line() == "FAIL x: 2e-05 (at most 1e-05)"
    assert report.within("x", 0.0, report.TOLERANCE).line().startswith("ok   x: 0")


def test_the_dropout_rows_pass_one_distribution_and_fail_a_changed_mean_or_variance():
    """dropout_figures on simulated draws (normal logits, 400 draws in 20 groups, 2,000 logits): two
    sides drawn from one distribution pass both rows in each of 20 tries; a variance 10% larger on
    one side fails the variance row, a mean larger by a fifth of a draw's spread at one logit fails
    the means row."""
    import numpy as np

    rng = np.random.default_rng(0)
    draws, groups = 400, 20

    def side(scale=1.0, shift=0.0):
        sums, squares = np.zeros((groups, 2000)), np.zeros((groups, 2000))
        mean = np.linspace(-1, 1, 2000)
        mean[0] += shift
        for i in range(draws):
            drawn = mean + scale * rng.normal(size=2000)
            sums[i % groups] += drawn
            squares[i % groups] += drawn ** 2
        return sums, squares

    for _ in range(20):
        z, z_bound, t, t_bound, *_ = report.dropout_figures(side(), side(), draws)
        assert z <= z_bound and t <= t_bound, (z, z_bound, t, t_bound)
    z, z_bound, t, t_bound, ours, theirs = report.dropout_figures(side(scale=1.1 ** 0.5), side(), draws)
    assert t > t_bound and abs(ours / theirs - 1.1) < 0.02
    z, z_bound, t, t_bound, *_ = report.dropout_figures(side(shift=0.4), side(), draws)  # 8 standard errors
    assert z > z_bound


def test_t_quantile_matches_students_table():
    """The variance row's bound: Student's t quantiles from its Cornish-Fisher approximation, against
    tables (scipy.stats.t.ppf; two-sided 5% and 1% at 10, 20 and 38 degrees of freedom, and 1e-4 at 38)."""
    for p, dof, table in ((0.975, 10, 2.228), (0.975, 20, 2.086), (0.995, 20, 2.845), (0.995, 38, 2.712),
                          (0.99995, 38, 4.346)):
        assert abs(report.t_quantile(p, dof) / table - 1) < 0.01, (p, dof, report.t_quantile(p, dof))


@pytest.fixture(scope="module")
def their_side(quick_start, tmp_path_factory):
    """The reference's process at the check's first size, run once for the tests that change the
    port: (Theirs, the port's model and Hparams trained by the training rows, the reference's greedy
    translations of that model's weights), after checking that every row of that size is ok as the
    port is."""
    prepro = str(quick_start.prepro)
    theirs = report.reference_side(CODE, prepro, str(tmp_path_factory.mktemp("their_side")), report.CHECK_SIZES[0])
    rows, (model, hp) = report.training_rows(theirs, prepro, "plain")
    rows += report.dropout_rows(theirs, prepro, "plain") + [report.data_row(theirs, prepro)]
    lines = report.reference_translations(CODE, theirs, model, hp, prepro)
    rows += report.decoding_rows(lines, model, hp, prepro, "plain")
    assert all(row.ok for row in rows), [row.line() for row in rows]
    return theirs, (model, hp), lines


def shifted_positions(monkeypatch):
    """The sinusoid table one position on: position p encoded as p + 1."""
    import modules
    table = modules.sinusoid
    monkeypatch.setattr(modules, "sinusoid", lambda length, d, dtype="float32", start=0: table(length, d, dtype,
                                                                                                start + 1))


def smoothing_over_v_minus_1(monkeypatch):
    """Label smoothing spreading its epsilon over the V - 1 wrong pieces, not over all V."""
    from keras import ops

    import modules

    def smoothed(logits, labels, epsilon):
        log_probs = ops.log_softmax(logits, axis=-1)  # (N, T, V)
        at_label = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1)[..., 0]  # (N, T)
        others = ops.sum(log_probs, axis=-1) - at_label  # (N, T)
        return -(1.0 - epsilon) * at_label - epsilon * others / (ops.shape(logits)[-1] - 1)  # (N, T)

    monkeypatch.setattr(modules, "smoothed_cross_entropy", smoothed)


def port_setting(**changes):
    """A change to the port's settings for the reference's run (weights.port_settings)."""
    def mutate(monkeypatch):
        settings = weights.port_settings
        monkeypatch.setattr(weights, "port_settings", lambda *args: dataclasses.replace(settings(*args), **changes))
    return mutate


def fast_norm_epsilon(monkeypatch):
    """The fast layer norm's epsilon hard-coded to 1e-6, whatever the layer is given."""
    from kernels import fast
    build = fast.LayerNormalization.__init__
    monkeypatch.setattr(fast.LayerNormalization, "__init__",
                        lambda self, *args, **kwargs: build(self, *args, **{**kwargs, "epsilon": 1e-6}))


def adam_epsilon(monkeypatch):
    """Adam's epsilon 1.5e-8 instead of the reference's 1e-8 (Keras' Adam and the fused one, its subclass)."""
    import keras
    adam = keras.optimizers.Adam.__init__
    monkeypatch.setattr(keras.optimizers.Adam, "__init__",
                        lambda self, *args, **kwargs: adam(self, *args, **{**kwargs, "epsilon": 1.5e-8}))


def key_biases_mixed_up(monkeypatch):
    """The key biases named as the reference's query biases (dense/bias for dense_1/bias)."""
    names = weights.weight_names

    def mixed(model):
        return [(variable, re.sub(r"attention/dense_1/bias$", "attention/dense/bias", name))
                for variable, name in names(model)]
    monkeypatch.setattr(weights, "weight_names", mixed)
    monkeypatch.setattr(report, "weight_names", mixed)


@runs_the_reference
@pytest.mark.parametrize("mutation, kernels, fails, stays", [
    (shifted_positions, "plain", ["logits"], ["layer normalization"]),
    (smoothing_over_v_minus_1, "plain", ["step 1: the loss"], ["logits", "layer normalization"]),
    (port_setting(layer_norm_epsilon=1e-6), "plain", ["layer normalization"], ["logits"]),
    (fast_norm_epsilon, "auto", ["layer normalization"], ["logits"]),
    (adam_epsilon, "plain", ["step 1: every weight"], ["logits", "layer normalization", "step 1: the loss"]),
    (adam_epsilon, "auto", ["step 1: every weight"], ["logits", "layer normalization", "step 1: the loss"]),
    (key_biases_mixed_up, "plain", ["key biases"], ["logits", "every weight", "the loss"]),
], ids=["positions", "smoothing", "norm-epsilon", "fast-norm-epsilon", "adam-epsilon", "fused-adam-epsilon",
        "key-biases"])
def test_a_change_on_the_ports_side_fails_its_row(their_side, quick_start, monkeypatch, mutation, kernels, fails,
                                                  stays):
    """Each row of the logits, layer-norm and training rows can fail: a change made to the port (in
    this test only) fails the row that should see it, and the rows named in `stays` stay ok (rows
    of later steps may fail too: the weights they start from differ)."""
    mutation(monkeypatch)
    rows, _ = report.training_rows(their_side[0], str(quick_start.prepro), kernels)
    for text in fails:
        assert any(text in row.what and not row.ok for row in rows), [row.line() for row in rows]
    for text in stays:
        assert all(row.ok for row in rows if text in row.what), [row.line() for row in rows]


@runs_the_reference
@pytest.mark.parametrize("changes", [{"residual_dropout": True}, {"attention_dropout": 0.0}, {"dropout_rate": 0.25}],
                         ids=["dropout-added", "dropout-removed", "rate"])
def test_dropout_in_another_place_or_at_another_rate_fails_a_dropout_row(their_side, quick_start, monkeypatch,
                                                                          changes):
    """The dropout rows see the port dropping out where the reference does not (each sublayer's
    output), not where it does (the attention weights), or at another rate (0.25 for 0.3)."""
    if "dropout_rate" in changes:
        monkeypatch.setitem(report.DROPOUT, "rate", changes["dropout_rate"])  # the port's side only: theirs is drawn
    else:
        port_setting(**changes)(monkeypatch)
    rows = report.dropout_rows(their_side[0], str(quick_start.prepro), "plain")
    assert not all(row.ok for row in rows), [row.line() for row in rows]


@runs_the_reference
def test_a_length_filter_off_by_one_fails_the_data_row(their_side, quick_start, monkeypatch):
    """The data row sees the port keeping only pairs shorter than the lengths, not those as long."""
    def filter_long(src, tgt, maxlen1, maxlen2):
        keep = np.array([i for i, (s, t) in enumerate(zip(src, tgt)) if len(s) + 1 < maxlen1 and len(t) + 1 < maxlen2],
                        dtype=np.int64)
        return keep, len(src) - len(keep)

    import numpy as np
    monkeypatch.setattr(data_load, "filter_long", filter_long)
    row = report.data_row(their_side[0], str(quick_start.prepro))
    assert not row.ok and row.figure > 0, row.line()


@runs_the_reference
def test_a_cache_index_off_by_one_fails_the_cached_decoding_rows(their_side, quick_start, monkeypatch):
    """The decoding rows see each decoded position written one cache entry on: cached greedy and beam
    search (both read the cache) differ from the reference's greedy lines; uncached greedy agrees."""
    import model as transformer
    import modules

    call = modules.MultiHeadAttention.call

    @functools.wraps(call)  # Keras reads the signature of call
    def shifted(self, *args, cache_index=None, **kwargs):
        return call(self, *args, cache_index=None if cache_index is None else cache_index + 1, **kwargs)

    monkeypatch.setattr(modules.MultiHeadAttention, "call", shifted)
    _, (model, hp), lines = their_side
    # the fixed-length cache (the loops compiled by XLA) writes at any entry: the translations differ
    fixed = transformer.rebuild(model, xla_decoding=True)
    rows = report.decoding_rows(lines, fixed, hp, str(quick_start.prepro), "plain")
    ok = {path: row.ok for path, row in zip(report.DECODINGS, rows)}
    assert ok == {"uncached greedy": True, "cached greedy": False, "beam search of beam 1": False}, \
        [row.line() for row in rows]
    import keras
    if keras.backend.backend() == "tensorflow":  # as one graph the cache grows a step at a time: an error
        import numpy as np

        import decoding
        source = np.array([[5, 6, 7, 3]], np.int32)
        for search in (decoding.greedy_decode, decoding.beam_search):
            with pytest.raises(Exception, match="GrowingCache: a decoding step writes at cache_index"):
                search(transformer.rebuild(model, xla_decoding=False), source)


@runs_the_reference
def test_the_references_train_py_cannot_go_on_from_an_exported_checkpoint(their_side, tmp_path, capfd):
    """What process/save_checkpoint.py says of its checkpoints: the reference's train.py, given one
    in its --logdir, restores every variable of its own, Adam's included, and stops at the first
    the checkpoint lacks."""
    from reference_bridge import launch

    theirs = their_side[0]
    logdir = tmp_path / "logdir"
    shutil.copytree(os.path.join(theirs.folder, "export", "ckpt"), logdir)
    (prefix,) = [name[:-len(".index")] for name in os.listdir(logdir) if name.endswith(".index")]
    with open(logdir / "checkpoint", "w", encoding="utf-8") as f:
        f.write(f'model_checkpoint_path: "{prefix}"\n')  # the copy's, relative to its folder
    with pytest.raises(UserError, match="train.py stopped"):
        launch.train_reference(CODE, theirs.files, str(tmp_path / "run"),
                               [*theirs.hparams, "--logdir", str(logdir), "--num_epochs", "1",
                                "--evaldir", str(tmp_path / "eval")])
    assert "Key beta1_power not found in checkpoint" in capfd.readouterr().err


def test_a_bleu_tokenisation_change_fails_the_bleu_row(quick_start, monkeypatch):
    """The BLEU row sees the port's "reference's way" tokenising with 13a instead of splitting at
    spaces as multi-bleu.perl does."""
    if not os.path.isfile(os.path.join(CODE, "multi-bleu.perl")):
        pytest.skip(f"the reference's files are not at {CODE}")
    import sacrebleu.metrics

    bleu = sacrebleu.metrics.BLEU
    monkeypatch.setattr(sacrebleu.metrics, "BLEU", lambda tokenize="13a", **kwargs: bleu(
        tokenize="13a" if tokenize == "none" else tokenize, **kwargs))
    assert not report.bleu_row(CODE, str(quick_start.prepro), str(quick_start.prepro.parent / "bleu_row")).ok


@runs_the_reference
def test_the_reference_trains_as_published_beside_the_port_and_its_checkpoint_serves_the_port(quick_start, tmp_path):
    """reference.py curves runs the equality report, then the reference's own train.py and the
    port's multi30k_reference (one run a side, one epoch, tiny): the reference writes its dev
    translations, summaries and a checkpoint; the table and the picture hold both runs; a second
    call trains nothing. Converted, the reference's checkpoint decodes dev greedily to the
    reference's own translations, and translate.py (beam 4) and export.py take the converted run."""
    prepro, work = str(quick_start.prepro), tmp_path / "work"
    command = ["reference.py", "curves", "--reference_dir", CODE, "--prepro_dir", prepro, "--workdir", str(work),
               "--runs", "1", "--", "--num_epochs", "1", "--lr", "0.003", "--warmup_steps", "4", *report.CHECK_SIZES[0]]
    run = run_script(*command, timeout=1800)  # the equality report (minutes), then both sides' training
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "agree: the port computes the reference's numbers" in run.stdout  # the equality report came first
    assert run.stdout.index("agree: the port") < run.stdout.index("the reference's train.py (")
    table = (work / "curves.md").read_text(encoding="utf-8")
    first = next(line for line in table.splitlines() if line.startswith("| 1 |"))
    assert len([cell for cell in first.split("|")[2:-1] if cell.strip()]) == 6, table  # both sides, three figures
    assert table.count("| reference run ") == 1 and table.count("| port seed ") == 1, table
    assert "sacreBLEU: the reference " in table and "One run a side" in table and "commit fb023bb" in table
    assert (work / "curves.png").stat().st_size > 10000
    again = run_script(*command, timeout=900)
    assert again.returncode == 0 and "train.py" not in again.stdout, again.stdout[-2000:]  # nothing trained
    assert "agree" not in again.stdout  # nor checked again

    run_dir = work / "reference" / "run1"
    (translations,) = (run_dir / "eval" / "1").iterdir()
    theirs = translations.read_text(encoding="utf-8").splitlines()
    # its own multi-bleu.perl ran, unless every translation has fewer than 4 words: it then divides by
    # zero (its 4-gram count) and prints nothing, which a model this small trained for 4 steps can hit
    assert theirs[-1].startswith("BLEU = ") or max(len(line.split()) for line in theirs) < 4, theirs[-3:]
    prefix = next(p for p in (run_dir / "log" / "1").glob("*.index")).with_suffix("")
    logdir = tmp_path / "converted"
    run = run_script("reference.py", "convert", "--ckpt", str(prefix), "--prepro_dir", prepro, "--logdir", str(logdir))
    assert run.returncode == 0, run.stderr[-3000:]

    model, hp = weights.from_reference(str(prefix), prepro, str(tmp_path / "again"))
    # its train.py seeds nothing, so its argmax may choose <pad> or <s> in any share of the lines
    # (30 of dev's 50 in one run): those lines are compared up to there; and a model trained for 4
    # steps may put </s> first in every line (no word to compare: each line still compares that
    # first choice, and the check compares words from seeded weights)
    compared, differ, cut, words = report.greedy_differences(theirs, model, hp, prepro)
    dev = data_load.load_text(prepro, "dev", "en")
    assert differ == 0 and compared == len(dev), (compared, differ, cut, words)
    translated = subprocess.run([sys.executable, "translate.py", "--logdir", str(logdir), "--beam_size", "4"], cwd=ROOT,
                                input="Ein Mann fährt Fahrrad.\n", capture_output=True, text=True, timeout=300)
    # one line out for the line in; it may be empty: a model trained for 4 steps can put </s> first
    assert translated.returncode == 0 and len(translated.stdout.splitlines()) == 1, translated.stderr[-3000:]
    exported = run_script("export.py", "--logdir", str(logdir), "--format", "ctranslate2",
                          "--output", str(tmp_path / "ct2"))
    assert exported.returncode == 0, exported.stderr[-3000:]


def test_curves_refuses_a_setting_the_reference_ignores(quick_start, tmp_path, monkeypatch):
    """curves gives its arguments after -- to both sides; the reference's code never reads
    --smoothing (it always smooths by 0.1), so the two sides would train different losses: curves
    refuses it, naming it, before the equality report or any training."""
    ran = []
    monkeypatch.setattr(report, "check", lambda *args: ran.append(args) or [])
    monkeypatch.setattr(experiment, "train_reference", lambda *args: ran.append(args))
    for args in (["--smoothing", "0.2"], ["--warmup_steps", "10", "--smoothing=0.2"]):
        with pytest.raises(UserError, match="the reference ignores --smoothing .*always smooths by 0.1"):
            experiment.curves(None, str(quick_start.prepro), str(tmp_path / "work"), 1, args)
    assert not ran and not (tmp_path / "work" / "reference").exists()


def test_convert_compares_the_pieces_not_only_their_count(quick_start, tmp_path):
    """A reference checkpoint converts only with the prepro folder of its own vocabulary: its
    --vocab file's pieces, in order (a score after a tab or not), not just as many of them."""
    sp = data_load.load_vocab(str(quick_start.prepro))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    vocab = tmp_path / "bpe.vocab"
    vocab.write_text("".join(f"{p}\t-{i}\n" for i, p in enumerate(pieces)), encoding="utf-8")
    weights.same_pieces(str(vocab), str(quick_start.prepro), "ckpt")  # the same pieces: no error
    swapped = pieces[:5] + [pieces[6], pieces[5]] + pieces[7:]
    vocab.write_text("".join(p + "\n" for p in swapped), encoding="utf-8")
    with pytest.raises(UserError, match=f"piece 5 is {re.escape(repr(pieces[6]))} there"):
        weights.same_pieces(str(vocab), str(quick_start.prepro), "ckpt")
    vocab.write_text("".join(p + "\n" for p in pieces[:-1]), encoding="utf-8")
    with pytest.raises(UserError, match=f"{len(pieces) - 1} pieces there, {len(pieces)} here"):
        weights.same_pieces(str(vocab), str(quick_start.prepro), "ckpt")
    with pytest.raises(UserError, match="cannot be read"):
        weights.same_pieces(str(tmp_path / "missing.vocab"), str(quick_start.prepro), "ckpt")
