"""eval.py: scores, beam search and averaged checkpoints, and its one-line errors (on the quick start's model)."""
import dataclasses
import json
import os
import re
import shutil

import pytest

from conftest import SHARED, assert_one_line_error, run_script


def test_eval_errors_are_one_line(quick_start, tmp_path):
    dirs = quick_start.dirs
    os.makedirs(tmp_path / "empty")
    import hyperparams
    hyperparams.save_hparams(hyperparams.preset("sample"), str(tmp_path / "empty"))
    none = run_script("eval.py", "--logdir", str(tmp_path / "empty"))
    assert none.returncode == 2 and "Traceback" not in none.stderr
    assert "no checkpoint; train first" in none.stderr and len(none.stderr.strip().splitlines()) == 1
    wrong = run_script("eval.py", *dirs, "--d_model", "32")
    assert wrong.returncode == 2 and "checkpoint of a different model: d_model 64 (settings say 32)" in wrong.stderr
    mixed = run_script("train.py", *dirs, "--d_model", "32")
    assert mixed.returncode == 2 and "trained with other settings (d_model 64 -> 32)" in mixed.stderr


def test_reference_outputs_score_as_published():
    """Our scoring, on the reference's own tst2013/tst2014 translations, gives its published figures."""
    data = os.path.join(SHARED, "data")
    if not os.path.isdir(data):
        pytest.skip("../shared is not beside the project")
    import prepro
    from support import scoring

    cases = (("iwslt2016_E19L2.64B28.06", "tst2013", 28.06, 33.07),
             ("iwslt2016_E19L2.64-29146B23.88", "tst2014", 23.88, 27.84))
    for name, tst, reference_way, sacre in cases:
        hyps = scoring.read_hypotheses(os.path.join(data, "reference-outputs", name))
        xml = os.path.join(data, "iwslt2017-en-de", f"IWSLT17.TED.{tst}.en-de.{{}}.xml")
        _, refs = prepro.read_iwslt_pair(xml.format("de"), xml.format("en"))
        scores = scoring.bleu_scores(hyps, refs)
        assert round(scores["reference"], 2) == reference_way
        assert round(scores["sacrebleu"], 2) == sacre


@pytest.mark.slow
def test_eval_beam_search_and_checkpoint_averaging(quick_start):
    dirs = quick_start.dirs
    run = run_script("eval.py", *dirs, "--beam_size", "4", "--average_last", "3")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mean of the newest 3" in run.stdout
    assert run.stdout.strip().splitlines()[-1].endswith(", beam 4, alpha 0.6")
    too_many = run_script("eval.py", *dirs, "--average_last", "9")
    assert too_many.returncode == 2 and "than the run keeps (keep_checkpoints 5)" in too_many.stderr


@pytest.mark.slow
def test_average_last_is_the_element_wise_mean_of_the_newest_checkpoints(quick_start):
    import numpy as np

    from trained import checkpoints
    import eval as evaluation
    import hyperparams
    hp = dataclasses.replace(hyperparams.load_hparams(str(quick_start.log)), average_last=3)
    model, _, name = evaluation.load_trained(hp)
    paths = [path for _, path in checkpoints.epoch_checkpoints(hp.logdir)[-3:]]
    each = [checkpoints.load(path, hp).get_weights() for path in paths]
    got = model.get_weights()
    assert len(got) == len(each[0]) > 40
    for mean, *weights in zip(got, *each):
        np.testing.assert_allclose(mean, np.mean(weights, axis=0), rtol=1e-6, atol=1e-7)
    assert not all(np.array_equal(a, b) for a, b in zip(got, each[-1]))  # not simply the newest
    assert name == paths[-1][:-len(".keras")] + "_avg3.keras"
    assert evaluation.averaged_count(name) == 3
    alone = evaluation.load_trained(hp, ckpt=paths[0])  # a checkpoint named is loaded alone
    assert alone[2] == paths[0] and evaluation.averaged_count(alone[2]) == 1
    for mine, its in zip(alone[0].get_weights(), each[0]):
        np.testing.assert_array_equal(mine, its)


@pytest.mark.slow
def test_a_run_with_fewer_epochs_than_average_last_averages_those_it_has(quick_start, tmp_path):
    from trained import checkpoints
    import hyperparams
    from trained.runs import load_trained
    run = tmp_path / "run"
    shutil.copytree(quick_start.log / "vocab", run / "vocab")
    shutil.copy(quick_start.log / "hparams.json", run)
    newest = [path for _, path in checkpoints.epoch_checkpoints(str(quick_start.log))[-2:]]
    (run / "ckpt").mkdir()
    for path in newest:
        shutil.copy(path, run / "ckpt")
    hp = dataclasses.replace(hyperparams.load_hparams(str(run)), average_last=5)
    _, _, name = load_trained(hp)
    assert name == str(run / "ckpt" / os.path.basename(newest[-1]))[:-len(".keras")] + "_avg2.keras"


def test_a_damaged_checkpoint_is_a_one_line_error(quick_start, tmp_path):
    dirs = quick_start.dirs
    newest = sorted(os.listdir(quick_start.log / "ckpt"))[-1]
    data = (quick_start.log / "ckpt" / newest).read_bytes()
    damaged = tmp_path / "damaged.keras"
    damaged.write_bytes(data[:len(data) // 2])
    run = run_script("eval.py", *dirs, "--ckpt", str(damaged))
    assert_one_line_error(run, rf"{re.escape(str(damaged))}: cannot load this checkpoint")


def test_an_id_beyond_the_vocabulary_is_a_one_line_error(quick_start, tmp_path):
    import shutil

    import numpy as np
    prepro_dir = tmp_path / "prepro"
    shutil.copytree(quick_start.prepro, prepro_dir)
    vocab_size = json.loads((prepro_dir / "meta.json").read_text())["vocab_size"]
    with np.load(prepro_dir / "train.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["tgt_ids"][7] = vocab_size
    np.savez(prepro_dir / "train.npz", **arrays)
    run = run_script("train.py", "--prepro_dir", str(prepro_dir), "--logdir", str(tmp_path / "log"))
    assert_one_line_error(run, rf"{re.escape(str(prepro_dir / 'train.npz'))}: tgt_ids holds id {vocab_size} "
                               rf"but the vocabulary has {vocab_size}")


def test_a_broken_hparams_json_is_a_one_line_error_naming_the_line(tmp_path):
    logdir = tmp_path / "log"
    os.makedirs(logdir)
    (logdir / "hparams.json").write_text('{\n  "d_model": 64,\n  "d_ff"\n}\n', encoding="utf-8")
    run = run_script("eval.py", "--logdir", str(logdir))
    assert_one_line_error(run, rf"{re.escape(str(logdir / 'hparams.json'))}: not valid JSON \(.*line 4 column 1\b")
    assert len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_eval_translates_a_150_piece_sentence_whole(quick_start, tmp_path, monkeypatch, capsys):
    """As the reference's evaluation: a dev sentence three times maxlen1 (50) is translated as one
    sequence, not cut into pieces (translate.py still cuts, with a note)."""
    import shutil

    import data_load
    import eval as evaluation
    from trained import lines as text_lines
    prepro = tmp_path / "prepro"
    shutil.copytree(quick_start.prepro, prepro)
    sp = data_load.load_vocab(str(prepro))
    train = data_load.load_text(str(prepro), "train", "de")
    long, i = "", 0
    while len(sp.encode(long)) < 150:
        long, i = f"{long} {train[i]}".strip(), i + 1
    for lang, first in (("de", long), ("en", "A long sentence.")):
        lines = data_load.load_text(str(prepro), "dev", lang)
        with open(prepro / f"dev.{lang}", "w", encoding="utf-8") as f:
            f.write("\n".join([first] + lines[1:]) + "\n")
    lengths = []
    plain = text_lines.translate
    monkeypatch.setattr(text_lines, "translate", lambda model, sp, seqs, *a, **k: lengths.extend(map(len, seqs))
                        or plain(model, sp, seqs, *a, **k))
    evaluation.main(["--preset", "sample", "--prepro_dir", str(prepro), "--logdir", str(quick_start.log),
                     "--split", "dev"])
    assert len(lengths) == 50 and max(lengths) == len(sp.encode(long)) >= 150
    assert "pieces" not in capsys.readouterr().err
    trained = evaluation.load_trained(evaluation.hyperparams.load_hparams(str(quick_start.log)))[0]
    cut = text_lines.translate_lines(trained,
                                   sp, [long], 50, 4096, source="x")
    assert len(lengths) > 51 and "translated in" in capsys.readouterr().err and cut[0]


def test_sacrebleu_keeps_its_smoothing_and_the_reference_way_has_none():
    """sacreBLEU's default exponential smoothing (in its signature) gives a hypothesis without a
    matching 4-gram a score above 0; multi-bleu.perl's way does not smooth, and gives 0."""
    from support import scoring

    scores = scoring.bleu_scores(["a man rides the bike"], ["a man rides a bike"])
    assert "smooth:exp" in scores["sacrebleu_signature"] and "smooth:none" in scores["reference_signature"]
    assert scores["sacrebleu"] > 0 and scores["reference"] == 0
