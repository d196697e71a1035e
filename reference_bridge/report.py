"""The equality report: the reference's code and the port, from the same random weights at a tiny
size, compute the same logits, losses, weights, greedy translations and BLEU (check)."""
import os
import re
import subprocess
import typing

import data_load
from reference_bridge.launch import COMMIT, PROCESS, run_reference, write_inputs
from reference_bridge.weights import from_reference, to_reference, weight_names, weight_pairs
from support.utils import UserError

def compare_line(theirs, ours):
    """One dev line of the reference's greedy translation (as its utils.postprocess writes it)
    against the port's (decoded the same way): (differs, cut, words compared). The reference's
    argmax may choose <pad> or <s>, which the port's never does; until then both choose the same
    tokens, so such a line is compared up to that token (cut)."""
    head = re.split("<pad>|<s>", theirs)[0].rstrip()  # the whole line when it holds neither
    cut = head != theirs.rstrip()
    differs = not ours.startswith(head) if cut else ours != theirs.strip()
    return differs, cut, len(head.split())


# The port's ways of decoding greedily, each compared with the reference's greedy translations
DECODINGS = ("uncached greedy", "cached greedy", "beam search of beam 1")


def greedy_differences(theirs, model, hp, prepro_dir, decoding_path="uncached greedy"):
    """The reference's dev translations (theirs: the lines its test.py or train.py wrote) against
    the port's greedy decoding of dev with model, one of DECODINGS, line by line (compare_line):
    (lines compared, lines that differ, lines compared up to a <pad> or <s> of the reference's,
    words compared)."""
    import numpy as np

    import decoding
    sp = data_load.load_vocab(prepro_dir)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    dev, _ = data_load.load_split(prepro_dir, "dev")
    source = data_load.encoder_inputs(dev, multiple=1)
    if decoding_path == "beam search of beam 1":
        ours = decoding.beam_search(model, source, beam_size=1, alpha=0.0, max_len=hp.maxlen2)
    else:
        ours = decoding.greedy_decode(model, source, max_len=hp.maxlen2, cached=decoding_path == "cached greedy")
    lines = [compare_line(line, "".join(pieces[i] for i in row).split("</s>")[0].replace("\u2581", " ").strip())
             for line, row in zip(theirs[:len(dev)], np.asarray(ours))]
    differ, cut, words = (sum(column) for column in zip(*lines))  # dev is never empty
    return len(lines), differ, cut, words


# The check's model: tiny (the equalities do not depend on the size), every length the sample's;
# check() stretches maxlen1 and maxlen2 to longer sentences (the reference's tables stop there)
CHECK_MAXLEN = 24
CHECK_SIZES = ["--d_model", "16", "--d_ff", "32", "--num_blocks", "2", "--num_heads", "2",
               "--maxlen1", str(CHECK_MAXLEN), "--maxlen2", str(CHECK_MAXLEN)]
# Its training: dropout off, and a peak learning rate of 0.01 at step 3, so that each step moves the
# weights by about 0.01, far beyond the tolerance
CHECK_TRAINING = ["--dropout_rate", "0", "--lr", "0.01", "--warmup_steps", "3"]
TOLERANCE = 1e-5  # float32, for logits, losses and weights
# The --kernels the port is checked with: modules.py as written, and the faster kernels every run
# of the documents uses (on TensorFlow, auto is every kernel: the same as fast)
KERNELS = ("plain", "auto")


class Row(typing.NamedTuple):
    """One line of the check's report: what was compared, the figure, the bound it must be within
    (None: a figure reported, not bounded), and whether it is."""
    what: str
    figure: float
    bound: float = None
    ok: bool = True

    def line(self):
        bound = "" if self.bound is None else f" (at most {self.bound:.3g})"
        return f"{'ok  ' if self.ok else 'FAIL'} {self.what}: {self.figure:.3g}{bound}"


def within(what, figure, bound):
    return Row(what, float(figure), bound, bool(figure <= bound))


def training_rows(want, batches, random_weights, prepro_dir, workdir, kernels, trained):
    """The logits and training rows of check() for the port built with `kernels` (a --kernels value)
    from the reference's random weights, against the reference's figures (want); the trained port
    model and its Hparams go into trained[kernels]."""
    import numpy as np
    from keras import ops

    label = f"--kernels {kernels}"
    model, hp = from_reference(random_weights, prepro_dir, os.path.join(workdir, f"port_{kernels}"), kernels)
    # The port's own float32 noise: the same steps from the same weights, compiled by XLA (the same
    # sums in another order). Adam divides each weight's gradient by that weight's own history, so
    # where a gradient is small beside the terms it is summed from, their rounding grows into the
    # step; with thousands of pieces this reaches 1e-5 in five steps. A bound below it tests noise.
    again, _ = from_reference(random_weights, prepro_dir, os.path.join(workdir, f"port_{kernels}_xla"), kernels)
    again.jit_compile = not model.jit_compile
    again.make_train_function(force=True)

    (x, d), y = batches[0]
    logits = ops.convert_to_numpy(model((x, d), training=False))  # (N, T2, V)
    real = y != 0
    rows = [within(f"{label}: logits of the first batch at real target positions, largest difference",
                   np.abs(logits[real] - want["0:logits"][real]).max(), TOLERANCE)]
    names = weight_names(model)
    before = [np.array(variable) for variable, _ in names]
    key_biases = 0.0
    for k, ((x, d), y) in enumerate(batches, 1):
        loss = float(model.train_on_batch((x, d), y))
        again.train_on_batch((x, d), y)
        rows.append(within(f"{label}, step {k}: the loss, difference", abs(loss - float(want[f"{k}:loss"])),
                           TOLERANCE))
        largest = own = 0.0
        for (variable, value), (other, _) in zip(weight_pairs(model, lambda name, k=k: want[f"{k}:{name}"]),
                                                 weight_names(again)):
            ours = np.array(variable)
            if variable.path.endswith("key/bias"):
                key_biases = max(key_biases, np.abs(ours).max(), np.abs(value).max())
            else:
                largest = max(largest, np.abs(ours - value).max())
                own = max(own, np.abs(ours - np.array(other)).max())
        rows.append(within(f"{label}, step {k}: every weight but the key biases, largest difference (the port "
                           f"against itself with XLA: {own:.3g}; the bound: {TOLERANCE:g}, or twice that if larger)",
                           largest, max(TOLERANCE, 2 * own)))
    rows.append(within(f"{label}: the attention's key biases (true gradient 0), largest value on either side",
                       key_biases, 1e-3))
    moved = max(np.abs(np.array(variable) - b).max() for (variable, _), b in zip(names, before))
    rows.append(Row(f"{label}: the steps moved the weights by (largest change)", float(moved)))
    trained[kernels] = model, hp
    return rows


def check(code, prepro_dir, workdir, steps=5, sentences=8):
    """The port computes the reference's numbers: the reference's own code (code, run in its process)
    and the port (from_reference) from the same random weights, at a tiny size, on prepro_dir's
    data; the rows of the report (Row), every one ok when they agree.

    Rows 1 and 2 come once for each --kernels of KERNELS, row 3 once for each with each way of
    decoding of DECODINGS.

    1. Logits: the first batch's, in inference mode, at every target position that is not padding.
    2. Training: `steps` steps of each side's own training (the reference's train(): its loss,
       noam_scheme, tf.train.AdamOptimizer; the port: the iwslt2016 preset's loss, schedule and Adam,
       compiled by from_reference) on the same batches of `sentences` pairs, dropout off: each
       step's loss, and every weight after each step, within TOLERANCE or within twice the port's
       own float32 noise (the port trained again with XLA), whichever is larger. The attention's
       key biases are reported apart: q . b_k is the same for every key, so the softmax ignores
       them and their true gradient is 0; Adam turns each engine's rounding noise into tiny steps
       of its own.
    3. Greedy decoding: the trained weights (--kernels plain), written as the reference's checkpoint
       (to_reference), restored by its own test.py, which translates dev: its lines and the port's
       decoding of dev from the same weights (uncached and cached greedy, beam search of beam 1),
       line by line. The reference's argmax may choose <pad> or <s>, which the
       port's never does: such a line is compared up to that token (counted).
    4. BLEU: the reference's multi-bleu.perl and the port's "reference's way" (scoring.bleu_scores)
       on dev's references and the same sentences with a fifth of their words dropped."""
    import numpy as np

    import model as transformer
    from support.scoring import bleu_scores

    workdir = os.path.abspath(workdir)
    files = write_inputs(prepro_dir, os.path.join(workdir, "data"))
    src, tgt = data_load.load_split(prepro_dir, "train")
    if len(src) < steps * sentences:
        raise UserError(f"--prepro_dir {prepro_dir}: {len(src)} training pairs, the check needs {steps * sentences}")
    batches = [data_load.training_arrays(src[i:i + sentences], tgt[i:i + sentences], multiple=1)
               for i in range(0, steps * sentences, sentences)]
    dev, _ = data_load.load_split(prepro_dir, "dev")
    longest = max(len(ids) for ids in [*src[:steps * sentences], *tgt[:steps * sentences], *dev]) + 1  # </s>
    maxlen = str(max(longest, CHECK_MAXLEN))
    sizes = [*CHECK_SIZES, "--maxlen1", maxlen, "--maxlen2", maxlen]  # the last given wins
    np.savez(os.path.join(workdir, "batches.npz"), **{f"{k}{i}": a for i, ((x, d), y) in enumerate(batches)
                                                      for k, a in (("x", x), ("d", d), ("y", y))})
    logdir, out = os.path.join(workdir, "reference"), os.path.join(workdir, "reference.npz")
    script = os.path.join(PROCESS, "check.py")
    if run_reference(code, workdir, script, [os.path.join(workdir, "batches.npz"), out, *files, *sizes,
                                             *CHECK_TRAINING, "--logdir", logdir]) != 0:
        raise UserError("the reference's code stopped (its output above)")
    want = np.load(out)
    rows, trained = [], {}
    for kernels in KERNELS:
        rows += training_rows(want, batches, os.path.join(logdir, "random-0"), prepro_dir, workdir, kernels, trained)
    model, hp = trained["plain"]

    prefix = to_reference(model, hp, prepro_dir, code, os.path.join(workdir, "export"))
    given = dict(zip(files[::2], files[1::2]))
    test_dir = os.path.join(workdir, "export", "test")
    if run_reference(code, os.path.join(workdir, "export"), "test.py",
                     ["--test1", given["--eval1"], "--test2", given["--eval3"], "--vocab", given["--vocab"],
                      "--vocab_size", given["--vocab_size"], *sizes, "--ckpt", prefix,
                      "--testdir", test_dir]) != 0:
        raise UserError("the reference's test.py stopped (its output above)")
    (written,) = [name for name in os.listdir(test_dir) if name.startswith(os.path.basename(prefix))]
    with open(os.path.join(test_dir, written), encoding="utf-8") as f:
        theirs = f.read().splitlines()
    for kernels in KERNELS:  # the same trained weights, built with each choice of kernels
        built = model if kernels == "plain" else transformer.rebuild(model, kernels)
        for path in DECODINGS:
            compared, differ, cut, words = greedy_differences(theirs, built, hp, prepro_dir, path)
            rows.append(within(f"--kernels {kernels}, {path} translations of dev: lines that differ from its greedy "
                               f"ones, of the {compared} compared ({words} words; {cut} up to where its argmax chose "
                               f"<pad> or <s>)", differ, 0))
            rows[-1] = rows[-1]._replace(ok=rows[-1].ok and words > 0)  # nothing compared is no agreement

    references = data_load.load_text(prepro_dir, "dev", data_load.load_meta(prepro_dir)["tgt_lang"])
    rng = np.random.default_rng(0)
    hypotheses = [" ".join(w for w in line.split() if rng.random() > 0.2) for line in references]
    perl = subprocess.run(["perl", os.path.join(code, "multi-bleu.perl"), given["--eval3"]],
                          input="".join(line + "\n" for line in hypotheses), capture_output=True, text=True)
    if perl.returncode != 0 or "BLEU = " not in perl.stdout:
        raise UserError(f"the reference's multi-bleu.perl failed: {perl.stderr.strip()[-500:]}")
    theirs_bleu = float(perl.stdout.split("BLEU = ")[1].split(",")[0])
    ours_bleu = bleu_scores(hypotheses, references)
    rows.append(within(f"BLEU, multi-bleu.perl ({theirs_bleu:.2f}) and the reference's way, difference",
                       abs(ours_bleu["reference"] - theirs_bleu), 0.01))
    rows[-1] = rows[-1]._replace(ok=rows[-1].ok and ours_bleu["reference_report"] == perl.stdout.strip())
    return rows


def equality_report(code, prepro_dir, workdir):
    """check()'s report, printed row by row; the rows that fail (none when the port computes the
    reference's numbers)."""
    os.makedirs(workdir, exist_ok=True)
    rows = check(code, prepro_dir, workdir)
    print(f"\nThe reference's code (commit {COMMIT[:7]}) and the port, the same weights in:")
    for row in rows:
        print(row.line())
    failed = [row for row in rows if not row.ok]
    print(f"{len(rows) - len(failed)} of {len(rows)} agree" + (": the port computes the reference's numbers"
                                                                if not failed else ""), flush=True)
    return failed
