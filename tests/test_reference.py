"""The port computes the reference's numbers: Kyubyong Park's own code (commit fb023bb), run unedited
by reference.py in a process of its own, against the port given the same weights (converted by
reference.py convert). Skipped, with the reason, where the reference's files or tf_keras are missing."""
import os
import subprocess
import sys

import numpy as np
import pytest

import data_load
import reference
from conftest import ROOT, run_script

CODE = os.path.join(os.path.dirname(ROOT), "shared", "reference", "kyubyong-transformer-fb023bb")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.isfile(os.path.join(CODE, "train.py")),
                                 reason=f"the reference's files are not at {CODE}"),
              pytest.mark.skipif(__import__("importlib").util.find_spec("tf_keras") is None,
                                 reason="tf_keras is not installed (bash setup.sh dev)")]
# A tiny model: both sides are checked at the same sizes, whatever they are
SIZES = ["--d_model", "16", "--d_ff", "32", "--num_blocks", "2", "--num_heads", "2", "--maxlen1", "24",
         "--maxlen2", "24"]


def test_same_weights_give_the_same_logits_and_loss(quick_start, tmp_path):
    """The reference's Transformer at random weights and the port holding them (converted): the
    logits at every target position that is not padding agree within 1e-5, and so does the loss."""
    prepro = str(quick_start.prepro)
    files = reference.write_inputs(prepro, str(tmp_path / "data"))
    src, tgt = data_load.load_split(prepro, "dev")
    (x, d), y = data_load.training_arrays(src[:12], tgt[:12], multiple=1)
    np.savez(tmp_path / "batch.npz", x=x, d=d, y=y)
    logdir = tmp_path / "reference"
    status = reference.run_reference(CODE, str(tmp_path), os.path.join(ROOT, "tests", "reference_forward.py"),
                                     [str(tmp_path / "batch.npz"), str(tmp_path / "out.npz"), *files, *SIZES,
                                      "--dropout_rate", "0", "--logdir", str(logdir)])
    assert status == 0
    want = np.load(tmp_path / "out.npz")

    from keras import ops

    import modules
    model, hp = reference.from_reference(str(logdir / "random-0"), prepro, str(tmp_path / "port"))
    logits = ops.convert_to_numpy(model((x, d), training=False))  # (N, T2, V)
    real = y != 0
    np.testing.assert_allclose(logits[real], want["logits"][real], rtol=0, atol=1e-5)
    loss = modules.LabelSmoothedCrossEntropy(hp.smoothing, pad_id=0)(y, logits)
    np.testing.assert_allclose(float(ops.convert_to_numpy(loss)), float(want["loss"]), rtol=0, atol=1e-5)


def test_five_training_steps_give_the_same_weights(quick_start, tmp_path):
    """Five steps of the reference's own training (its loss, noam_scheme and tf.train.AdamOptimizer)
    and five of the port's (the converted model, compiled as from_reference compiles it: the
    iwslt2016 preset's loss, schedule and Adam) on the same five batches, dropout off: after every
    step each weight agrees within 1e-5 (the attention's key biases aside: their true gradient is 0)
    and so does the step's loss. A peak learning rate of 0.01
    reached at step 3 makes the steps move the weights by about 0.01 each, far beyond the tolerance."""
    prepro = str(quick_start.prepro)
    files = reference.write_inputs(prepro, str(tmp_path / "data"))
    src, tgt = data_load.load_split(prepro, "train")
    batches = [data_load.training_arrays(src[8 * i:8 * i + 8], tgt[8 * i:8 * i + 8], multiple=1) for i in range(5)]
    np.savez(tmp_path / "batches.npz", **{f"{k}{i}": a for i, ((x, d), y) in enumerate(batches)
                                         for k, a in (("x", x), ("d", d), ("y", y))})
    logdir = tmp_path / "reference"
    status = reference.run_reference(CODE, str(tmp_path), os.path.join(ROOT, "tests", "reference_train_steps.py"),
                                     [str(tmp_path / "batches.npz"), str(tmp_path / "out.npz"), *files, *SIZES,
                                      "--dropout_rate", "0", "--lr", "0.01", "--warmup_steps", "3",
                                      "--logdir", str(logdir)])
    assert status == 0
    want = np.load(tmp_path / "out.npz")

    model, hp = reference.from_reference(str(logdir / "random-0"), prepro, str(tmp_path / "port"))
    assert hp.lr == 0.01 and hp.warmup_steps == 3 and hp.dropout_rate == 0.0
    port = [variable for variable, _ in reference.weight_names(model)]
    before = [np.array(variable) for variable in port]
    for k, ((x, d), y) in enumerate(batches, 1):
        loss = model.train_on_batch((x, d), y)
        np.testing.assert_allclose(float(loss), float(want[f"{k}:loss"]), rtol=0, atol=1e-5, err_msg=f"step {k}")
        for variable, value in reference.weight_pairs(model, lambda name, k=k: want[f"{k}:{name}"]):
            if variable.path.endswith("key/bias"):
                # q . b_k is the same for every key, so the softmax ignores the key bias: its true
                # gradient is 0, and Adam turns each engine's rounding noise into tiny steps of its own
                assert np.abs(np.array(variable)).max() < 1e-3 and np.abs(value).max() < 1e-3
                continue
            np.testing.assert_allclose(np.array(variable), value, rtol=0, atol=1e-5,
                                       err_msg=f"step {k}: {variable.path}")
    assert max(np.abs(np.array(v) - b).max() for v, b in zip(port, before)) > 1e-2  # the steps did move them
    # the other way: the port's weights saved as the reference's checkpoint, which its own test.py
    # restores and translates dev with, as the port's greedy decoding does
    prefix = reference.to_reference(model, hp, prepro, CODE, str(tmp_path / "export"))
    given = dict(zip(files[::2], files[1::2]))
    test_files = ["--test1", given["--eval1"], "--test2", given["--eval3"], "--vocab", given["--vocab"],
                  "--vocab_size", given["--vocab_size"]]
    test_dir = str(tmp_path / "export" / "test")
    status = reference.run_reference(CODE, str(tmp_path / "export"), "test.py",
                                     [*test_files, *SIZES, "--ckpt", prefix, "--testdir", test_dir])
    assert status == 0
    (written,) = (tmp_path / "export" / "test").glob(os.path.basename(prefix) + "*")  # its BLEU joins the name
    theirs = written.read_text(encoding="utf-8").splitlines()
    assert_same_greedy_translations(theirs, model, hp, prepro)


def assert_same_greedy_translations(theirs, model, hp, prepro):
    """The reference's dev translations (its postprocess's lines) are the port's uncached greedy
    decoding of dev with the same weights, line for line (see below for the lines left out)."""
    import decoding
    sp = data_load.load_vocab(prepro)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    src, _ = data_load.load_split(prepro, "dev")
    ours = decoding.greedy_decode(model, data_load.encoder_inputs(src, multiple=1), max_len=hp.maxlen2, cached=False)
    compared = 0
    for line, row in zip(theirs[:len(src)], np.asarray(ours)):
        # the reference's argmax may pick <pad> or <s>, which the port's never does: such lines are
        # left out; the others are written as its utils.postprocess writes them
        if "<pad>" not in line and "<s>" not in line:
            assert "".join(pieces[i] for i in row).split("</s>")[0].replace("\u2581", " ").strip() == line.strip()
            compared += 1
    assert compared >= len(src) // 2, compared


def test_the_reference_trains_as_published_and_its_checkpoint_serves_the_port(quick_start, tmp_path):
    """reference.py train runs the reference's own train.py (one epoch, tiny): it writes its dev
    translations and a checkpoint; converted, the checkpoint decodes dev greedily to the reference's
    own translations, and translate.py (beam 4) and export.py take the converted run."""
    prepro, work = str(quick_start.prepro), tmp_path / "work"
    run = run_script("reference.py", "train", "--reference_dir", CODE, "--prepro_dir", prepro, "--workdir", str(work),
                     "--", "--num_epochs", "1", "--batch_size", "64", "--lr", "0.003", "--warmup_steps", "4", *SIZES,
                     timeout=900)
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
    assert_same_greedy_translations(theirs, model, hp, prepro)
    translated = subprocess.run([sys.executable, "translate.py", "--logdir", str(logdir), "--beam_size", "4"], cwd=ROOT,
                                input="Ein Mann fährt Fahrrad.\n", capture_output=True, text=True, timeout=300)
    assert translated.returncode == 0 and translated.stdout.strip(), translated.stderr[-3000:]
    exported = run_script("export.py", "--logdir", str(logdir), "--format", "ctranslate2",
                          "--output", str(tmp_path / "ct2"))
    assert exported.returncode == 0, exported.stderr[-3000:]


def test_the_references_multi_bleu_and_the_ports_reference_way_agree(tmp_path):
    """The reference's own multi-bleu.perl and scoring.bleu_scores' "reference's way" give the same
    BLEU on the same files, to 0.01, and the same report line."""
    from scoring import bleu_scores
    references = data_load.load_text(os.path.join(ROOT, "corpora", "sample"), "dev", "en")
    rng = np.random.default_rng(0)
    hypotheses = [" ".join(w for w in line.split() if rng.random() > 0.2) for line in references]  # words dropped
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n", encoding="utf-8")
    (tmp_path / "hyp.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    with open(tmp_path / "hyp.txt", encoding="utf-8") as hyp:
        perl = subprocess.run(["perl", os.path.join(CODE, "multi-bleu.perl"), str(tmp_path / "ref.txt")], stdin=hyp,
                              capture_output=True, text=True, timeout=60)
    assert perl.returncode == 0, perl.stderr
    theirs = float(perl.stdout.split("BLEU = ")[1].split(",")[0])
    ours = bleu_scores(hypotheses, references)
    assert abs(ours["reference"] - theirs) < 0.01 and 10 < theirs < 90, (ours["reference"], theirs)
    assert ours["reference_report"] == perl.stdout.strip()
