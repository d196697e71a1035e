"""The equality report: the reference's code and the port, from the same random weights at two small
sizes, compute the same logits, losses, weights, dropout statistics, layer normalization, batches,
greedy translations and BLEU (check)."""
import json
import os
import re
import statistics
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


# The check's models: two sizes (the equalities do not depend on the size; the larger has more
# heads and blocks, and wider layers, for a reshape or an index to go wrong in), every length the
# data's: check() stretches maxlen1 and maxlen2 to the longest sentence (the reference's tables stop
# there)
CHECK_MAXLEN = 24
CHECK_SIZES = (("--d_model", "16", "--d_ff", "32", "--num_blocks", "2", "--num_heads", "2"),
               ("--d_model", "64", "--d_ff", "128", "--num_blocks", "3", "--num_heads", "4"))
# Its training: dropout off, and a peak learning rate of 0.01 at step 3, so that each step moves the
# weights by about 0.01, far beyond the tolerance
CHECK_TRAINING = ["--dropout_rate", "0", "--lr", "0.01", "--warmup_steps", "3"]
# The bounds: fixed numbers, none derived from a run's own figures
TOLERANCE = 1e-5  # float32: logits, losses, weights, layer normalization
# Adam divides each weight's gradient by that weight's own history, so where a gradient is small
# beside the terms it is summed from, their rounding grows into a step of its own: a few weights in
# ten thousand move apart by more than TOLERANCE, on each side as between the port and itself.
# The weights' rows: all but that few within TOLERANCE, every one within WEIGHTS_CAP.
WEIGHTS_QUANTILE = 0.999
WEIGHTS_CAP = 1e-3
KEY_BIASES = 1e-3  # the attention's key biases (true gradient 0): the sides' largest difference
ALPHA = 1e-4  # how often a dropout row fails when both sides drop out alike
# The dropout rows: the reference's default rate; draws in groups (the spread of the groups' figures
# is the variance row's yardstick); the logits of the first (most frequent) pieces
DROPOUT = {"rate": 0.3, "draws": 400, "groups": 20, "columns": 256}
# The seed of the port's dropout draws (the reference's process seeds its own)
DROPOUT_SEED = 1
NORM_SCALE = 1e-3  # the layer-norm row's inputs: a variance of 1e-6, where its epsilon (1e-8) shows
BATCH = 8  # sentences a batch, in the data row (and the training rows)
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


def size_label(size):
    """'d_model 16, 2 heads, 2+2 blocks' for a size of CHECK_SIZES."""
    given = dict(zip(size[::2], size[1::2]))
    return f"d_model {given['--d_model']}, {given['--num_heads']} heads, {given['--num_blocks']}+" \
           f"{given['--num_blocks']} blocks"


class Theirs(typing.NamedTuple):
    """What the reference's process computed at one size (reference_side), and what it was given."""
    folder: str  # the size's working folder
    label: str  # size_label
    want: dict  # its figures: reference_bridge/process/check.py's OUT.npz
    batches: list  # the training rows' batches, ((x, d), y)
    norm_input: object  # the layer-norm row's inputs, (32, d_model)
    files: list  # its file arguments (write_inputs)
    hparams: list  # its sizes (the same on the port's side: from_reference reads them)
    data: dict  # the data row's settings: maxlen1, maxlen2, batch_size

    @property
    def random_weights(self):
        return os.path.join(self.folder, "reference", "random-0")


def reference_side(code, prepro_dir, folder, size, steps=5, sentences=BATCH):
    """Run the reference's process (reference_bridge/process/check.py) at one size of CHECK_SIZES
    in folder: Theirs."""
    import numpy as np

    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    files = write_inputs(prepro_dir, os.path.join(folder, "data"))
    src, tgt = data_load.load_split(prepro_dir, "train")
    if len(src) < steps * sentences:
        raise UserError(f"--prepro_dir {prepro_dir}: {len(src)} training pairs, the check needs {steps * sentences}")
    batches = [data_load.training_arrays(src[i:i + sentences], tgt[i:i + sentences], multiple=1)
               for i in range(0, steps * sentences, sentences)]
    dev, _ = data_load.load_split(prepro_dir, "dev")
    longest = max(len(ids) for ids in [*src[:steps * sentences], *tgt[:steps * sentences], *dev]) + 1  # </s>
    maxlen = str(max(longest, CHECK_MAXLEN))
    hparams = [*size, "--maxlen1", maxlen, "--maxlen2", maxlen]
    d_model = int(dict(zip(size[::2], size[1::2]))["--d_model"])
    norm_input = (np.random.default_rng(0).normal(size=(32, d_model)) * NORM_SCALE).astype(np.float32)
    np.savez(os.path.join(folder, "batches.npz"), norm_input=norm_input,
             **{f"{k}{i}": a for i, ((x, d), y) in enumerate(batches) for k, a in (("x", x), ("d", d), ("y", y))})
    # the data row's lengths: the medians (with </s>), so that the length filter drops pairs
    data = {"maxlen1": int(np.median([len(s) for s in src])) + 1, "maxlen2": int(np.median([len(t) for t in tgt])) + 1,
            "batch_size": BATCH}
    with open(os.path.join(folder, "options.json"), "w", encoding="utf-8") as f:
        json.dump({"dropout": DROPOUT, "data": data}, f)
    out = os.path.join(folder, "reference.npz")
    if run_reference(code, folder, os.path.join(PROCESS, "check.py"),
                     [os.path.join(folder, "batches.npz"), out, os.path.join(folder, "options.json"), *files,
                      *hparams, *CHECK_TRAINING, "--logdir", os.path.join(folder, "reference")]) != 0:
        raise UserError("the reference's code stopped (its output above)")
    with np.load(out) as want:
        return Theirs(folder, size_label(size), dict(want), batches, norm_input, files, hparams, data)


def training_rows(theirs, prepro_dir, kernels):
    """The logits, layer-norm and training rows of check() for the port built with `kernels` (a
    --kernels value) from the reference's random weights, against the reference's figures; and the
    trained port model and its Hparams."""
    import numpy as np
    from keras import ops

    label, want = f"--kernels {kernels}", theirs.want
    model, hp = from_reference(theirs.random_weights, prepro_dir, os.path.join(theirs.folder, f"port_{kernels}"),
                               kernels)
    # The port's own float32 noise, reported beside the weights' rows: the same steps from the same
    # weights, compiled by XLA (the same sums in another order)
    again, _ = from_reference(theirs.random_weights, prepro_dir, os.path.join(theirs.folder, f"port_{kernels}_xla"),
                              kernels)
    again.jit_compile = not model.jit_compile
    again.make_train_function(force=True)

    (x, d), y = theirs.batches[0]
    logits = ops.convert_to_numpy(model((x, d), training=False))  # (N, T2, V)
    real = y != 0
    rows = [within(f"{label}: logits of the first batch at real target positions, largest difference",
                   np.abs(logits[real] - want["0:logits"][real]).max(), TOLERANCE)]
    norm = next(add_norm for *_, add_norm in model.sublayers()).norm  # gamma 1, beta 0 as yet: as its ln's
    normed = ops.convert_to_numpy(norm(theirs.norm_input))  # (32, d_model)
    rows.append(within(f"{label}: layer normalization of inputs of variance {NORM_SCALE ** 2:g} (where its epsilon "
                       f"shows), largest difference", np.abs(normed - want["norm"]).max(), TOLERANCE))
    names = weight_names(model)
    before = [np.array(variable) for variable, _ in names]
    key_biases = largest = 0.0
    for k, ((x, d), y) in enumerate(theirs.batches, 1):
        loss = float(model.train_on_batch((x, d), y))
        again.train_on_batch((x, d), y)
        rows.append(within(f"{label}, step {k}: the loss, difference", abs(loss - float(want[f"{k}:loss"])),
                           TOLERANCE))
        differ, own = [], []
        for (variable, value), (other, _) in zip(weight_pairs(model, lambda name, k=k: want[f"{k}:{name}"]),
                                                 weight_names(again)):
            ours = np.array(variable)
            if variable.path.endswith("key/bias"):
                key_biases = max(key_biases, np.abs(ours - value).max())
            else:
                differ.append(np.abs(ours - value).ravel())
                own.append(np.abs(ours - np.array(other)).ravel())
        differ, own = np.concatenate(differ), np.concatenate(own)
        largest = max(largest, differ.max())
        rows.append(within(f"{label}, step {k}: every weight but the key biases, the difference that all but "
                           f"{1 - WEIGHTS_QUANTILE:.1%} of them are within (the port against itself with XLA: "
                           f"{np.quantile(own, WEIGHTS_QUANTILE):.3g}, largest {own.max():.3g})",
                           np.quantile(differ, WEIGHTS_QUANTILE), TOLERANCE))
    rows.append(within(f"{label}: every weight but the key biases, largest difference over the steps", largest,
                       WEIGHTS_CAP))
    rows.append(within(f"{label}: the attention's key biases (true gradient 0: each side's rounding moves them), "
                       f"largest difference over the steps", key_biases, KEY_BIASES))
    moved = max(np.abs(np.array(variable) - b).max() for (variable, _), b in zip(names, before))
    rows.append(Row(f"{label}: the steps moved the weights by (largest change)", float(moved)))
    return rows, (model, hp)


def t_quantile(p, dof):
    """Student's t distribution's quantile p for dof degrees of freedom: the normal one corrected by
    the first three terms of its Cornish-Fisher expansion (against scipy's, for p up to 1 - 1e-5: within
    1.1% from 10 degrees of freedom, 0.1% from 20; the check's variance row has 38)."""
    z = statistics.NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * dof ** 3))


def dropout_figures(ours, theirs, draws):
    """Two sides' draws, each (sums, squares): per group of draws (draw i in group i % groups) the sum
    and the sum of squares of every logit compared, (groups, ...). The figures of the dropout rows:
    (largest |z| of a logit's two means, its bound; |Welch's t| of the groups' mean variances, its
    bound; the mean variance on each side). The bounds make each row fail with probability at most
    ALPHA when both sides draw from one distribution: Bonferroni over the logits for the means, t
    over the groups for the variance."""
    import numpy as np

    def moments(sums, squares):
        groups = len(sums)
        counts = np.array([len(range(g, draws, groups)) for g in range(groups)], dtype=np.float64)
        counts = counts.reshape(-1, *[1] * (sums.ndim - 1))
        mean = sums.sum(0) / draws
        variance = np.maximum((squares.sum(0) - draws * mean ** 2) / (draws - 1), 0)
        group_variances = ((squares - sums ** 2 / counts) / (counts - 1)).reshape(groups, -1).mean(1)  # (groups,)
        return mean, variance, group_variances

    (mean_a, var_a, group_a), (mean_b, var_b, group_b) = moments(*ours), moments(*theirs)
    spread = np.sqrt((var_a + var_b) / draws)
    gap = np.abs(mean_a - mean_b)
    z = np.where(spread > 0, gap / np.where(spread > 0, spread, 1), np.where(gap > 0, np.inf, 0))
    z_bound = statistics.NormalDist().inv_cdf(1 - ALPHA / (2 * z.size))
    groups = len(group_a)
    t = abs(group_a.mean() - group_b.mean()) / np.sqrt((group_a.var(ddof=1) + group_b.var(ddof=1)) / groups)
    return float(z.max()), z_bound, float(t), t_quantile(1 - ALPHA / 2, 2 * groups - 2), group_a.mean(), group_b.mean()


def dropout_rows(theirs, prepro_dir, kernels):
    """The dropout rows of check(): the port built with `kernels` from the reference's random weights
    with dropout at DROPOUT's rate, its logits for the first batch in training mode drawn as many
    times as the reference's (dropout_figures)."""
    import numpy as np
    from keras import ops

    import tensorflow as tf

    import keras

    label, rate, draws, groups, columns = (f"--kernels {kernels}", *(DROPOUT[k] for k in ("rate", "draws", "groups",
                                                                                         "columns")))
    # seeded as the reference's side is (tf.set_random_seed in its process): the same draws at every
    # run, so that a row passes or fails by the code, never by the run
    keras.utils.set_random_seed(DROPOUT_SEED)
    model, _ = from_reference(theirs.random_weights, prepro_dir,
                              os.path.join(theirs.folder, f"port_{kernels}_dropout"), kernels, dropout_rate=rate)
    (x, d), y = theirs.batches[0]
    real = y != 0
    sums = np.zeros(theirs.want["dropout:sum"].shape)
    squares = np.zeros_like(sums)
    draw = tf.function(lambda: model((x, d), training=True))  # traced once; each call draws anew
    for i in range(draws):
        drawn = ops.convert_to_numpy(draw())[real][:, :columns].astype(np.float64)
        sums[i % groups] += drawn
        squares[i % groups] += drawn ** 2
    z, z_bound, t, t_bound, ours, their = dropout_figures((sums, squares), (theirs.want["dropout:sum"],
                                                                            theirs.want["dropout:squares"]), draws)
    what = f"{label}: dropout {rate:g}, the first batch's logits over {draws} draws (the first {sums.shape[-1]} ids' " \
           f"at real target positions)"
    return [within(f"{what}: each logit's mean, largest difference in standard errors", z, z_bound),
            within(f"{what}: their variance, {ours:.4g} here and {their:.4g} there, |Welch's t| over {groups} groups "
                   f"of draws", t, t_bound)]


def data_row(theirs, prepro_dir):
    """The data row of check(): the reference's own data_load batches of the training files, unshuffled
    (written by its process), against the port's length filter and batches of the same pairs in the
    same order (data_load.filter_long, data_load.training_arrays), entry for entry."""

    src, tgt = data_load.load_split(prepro_dir, "train")
    maxlen1, maxlen2, size = theirs.data["maxlen1"], theirs.data["maxlen2"], theirs.data["batch_size"]
    keep, _ = data_load.filter_long(src, tgt, maxlen1, maxlen2)
    kept = int(theirs.want["data:kept"])
    differ, compared = abs(kept - len(keep)), 0
    for i, start in enumerate(range(0, len(keep), size)):
        idx = keep[start:start + size]
        (x, d), y = data_load.training_arrays([src[j] for j in idx], [tgt[j] for j in idx], multiple=1)
        ours = {"x": x, "x_seqlens": (x != 0).sum(1), "decoder_input": d, "y": y, "y_seqlens": (y != 0).sum(1)}
        for name, array in ours.items():
            if f"data:{i}:{name}" not in theirs.want:
                differ += array.size
                continue
            # its last batch goes on into the next pass over the data (its dataset repeats): those rows,
            # and the padding they need, are not the port's
            their = theirs.want[f"data:{i}:{name}"][:len(array)]
            if their.ndim == 2 and their.shape[1] > array.shape[1] and not their[:, array.shape[1]:].any():
                their = their[:, :array.shape[1]]
            differ += array.size if their.shape != array.shape else int((their != array).sum())
            compared += array.size
    batches = sum(1 for name in theirs.want if name.startswith("data:") and name.endswith(":x"))
    row = within(f"its data_load's batches of the training files (lengths at most {maxlen1}/{maxlen2} with </s>: it "
                 f"keeps {kept} of {len(src)} pairs, the port {len(keep)}; {batches} batches of {size}), entries of "
                 f"ids and lengths ({compared} compared) that differ from the port's", differ, 0)
    return row._replace(ok=row.ok and compared > 0 and kept < len(src))  # the filter has dropped pairs


def reference_translations(code, theirs, model, hp, prepro_dir):
    """The reference's test.py restoring model (written as its checkpoint, to_reference) and
    translating dev: its lines."""
    export = os.path.join(theirs.folder, "export")
    prefix = to_reference(model, hp, prepro_dir, code, export)
    given = dict(zip(theirs.files[::2], theirs.files[1::2]))
    test_dir = os.path.join(export, "test")
    if run_reference(code, export, "test.py",
                     ["--test1", given["--eval1"], "--test2", given["--eval3"], "--vocab", given["--vocab"],
                      "--vocab_size", given["--vocab_size"], *theirs.hparams, "--ckpt", prefix,
                      "--testdir", test_dir]) != 0:
        raise UserError("the reference's test.py stopped (its output above)")
    (written,) = [name for name in os.listdir(test_dir) if name.startswith(os.path.basename(prefix))]
    with open(os.path.join(test_dir, written), encoding="utf-8") as f:
        return f.read().splitlines()


def decoding_rows(lines, model, hp, prepro_dir, kernels):
    """The decoding rows of check(): model built with `kernels`, decoding dev each way of DECODINGS,
    against the reference's greedy translations of the same weights (lines)."""
    import model as transformer

    built = model if kernels == "plain" else transformer.rebuild(model, kernels)
    rows = []
    for path in DECODINGS:
        compared, differ, cut, words = greedy_differences(lines, built, hp, prepro_dir, path)
        row = within(f"--kernels {kernels}, {path} translations of dev: lines that differ from its greedy ones, of "
                     f"the {compared} compared ({words} words; {cut} up to where its argmax chose <pad> or <s>)",
                     differ, 0)
        rows.append(row._replace(ok=row.ok and words > 0))  # nothing compared is no agreement
    return rows


def bleu_row(code, prepro_dir, workdir):
    """The BLEU row of check(): the reference's multi-bleu.perl and the port's "reference's way"
    (scoring.bleu_scores) on dev's references and the same sentences with a fifth of their words
    dropped."""
    import numpy as np

    from support.scoring import bleu_scores

    given = dict(zip(*[iter(write_inputs(prepro_dir, os.path.join(workdir, "data")))] * 2))
    references = data_load.load_text(prepro_dir, "dev", data_load.load_meta(prepro_dir)["tgt_lang"])
    rng = np.random.default_rng(0)
    hypotheses = [" ".join(w for w in line.split() if rng.random() > 0.2) for line in references]
    perl = subprocess.run(["perl", os.path.join(code, "multi-bleu.perl"), given["--eval3"]],
                          input="".join(line + "\n" for line in hypotheses), capture_output=True, text=True)
    if perl.returncode != 0 or "BLEU = " not in perl.stdout:
        raise UserError(f"the reference's multi-bleu.perl failed: {perl.stderr.strip()[-500:]}")
    theirs_bleu = float(perl.stdout.split("BLEU = ")[1].split(",")[0])
    ours_bleu = bleu_scores(hypotheses, references)
    row = within(f"BLEU, multi-bleu.perl ({theirs_bleu:.2f}) and the reference's way, difference",
                 abs(ours_bleu["reference"] - theirs_bleu), 0.01)
    return row._replace(ok=row.ok and ours_bleu["reference_report"] == perl.stdout.strip())


def size_rows(code, theirs, prepro_dir):
    """Every row of check() at the size of theirs (reference_side), each named with that size."""
    rows, trained = [], {}
    for kernels in KERNELS:
        model_rows, trained[kernels] = training_rows(theirs, prepro_dir, kernels)
        rows += model_rows + dropout_rows(theirs, prepro_dir, kernels)
    rows.append(data_row(theirs, prepro_dir))
    model, hp = trained["plain"]
    lines = reference_translations(code, theirs, model, hp, prepro_dir)
    for kernels in KERNELS:  # the same trained weights, built with each choice of kernels
        rows += decoding_rows(lines, model, hp, prepro_dir, kernels)
    return [row._replace(what=f"[{theirs.label}] {row.what}") for row in rows]


def check(code, prepro_dir, workdir, sizes=CHECK_SIZES):
    """The port computes the reference's numbers: the reference's own code (code, run in its process)
    and the port (from_reference) from the same random weights, at each size of `sizes`, on
    prepro_dir's data; the rows of the report (Row), every one ok when they agree. Every bound is a
    fixed number (TOLERANCE, WEIGHTS_QUANTILE and WEIGHTS_CAP, KEY_BIASES, ALPHA), none derived from
    a run's own figures.

    At each size, rows 1 to 4 come once for each --kernels of KERNELS, row 6 once for each with each
    way of decoding of DECODINGS.

    1. Logits: the first batch's, in inference mode, at every target position that is not padding,
       within TOLERANCE.
    2. Layer normalization: the first norm's, at its initial gamma 1 and beta 0, of inputs whose
       variance (1e-6) is near its epsilon (1e-8), within TOLERANCE.
    3. Training: five steps of each side's own training (the reference's train(): its loss,
       noam_scheme, tf.train.AdamOptimizer; the port: the iwslt2016 preset's loss, schedule and Adam,
       compiled by from_reference) on the same batches of BATCH pairs, dropout off: each step's
       loss within TOLERANCE; after each step, all the weights but the 0.1% most moved by rounding
       (WEIGHTS_QUANTILE) within TOLERANCE, and every weight within WEIGHTS_CAP over the steps (the
       port's own noise, the port trained again with XLA, reported beside them). The attention's
       key biases apart: q . b_k is the same for every key, so the softmax ignores them
       and their true gradient is 0; Adam turns each engine's rounding noise into tiny steps of its
       own, so they agree within KEY_BIASES.
    4. Dropout: at DROPOUT's rate (the reference's embeddings and attention weights), the first
       batch's logits in training mode drawn DROPOUT["draws"] times on each side: each logit's mean
       (the largest gap in standard errors, within the normal distribution's bound for ALPHA over
       all of them) and their variance (the mean over the logits in each of DROPOUT["groups"] groups
       of draws, the two sides' groups within Student's t bound for ALPHA).
    5. Batches: the reference's own data_load (its length filter, encode and padded batches) on the
       training files, unshuffled, against the port's filter and batches of the same pairs, entry
       for entry; the lengths are the data's medians, so the filter drops pairs.
    6. Greedy decoding: the trained weights (--kernels plain), written as the reference's checkpoint
       (to_reference), restored by its own test.py, which translates dev: its lines and the port's
       decoding of dev from the same weights (uncached and cached greedy, beam search of beam 1),
       line by line. The reference's argmax may choose <pad> or <s>, which the
       port's never does: such a line is compared up to that token (counted).
    7. BLEU, once: the reference's multi-bleu.perl and the port's "reference's way"
       (scoring.bleu_scores) on dev's references and the same sentences with a fifth of their words
       dropped, within 0.01, and the same report line."""
    workdir = os.path.abspath(workdir)
    rows = []
    for size in sizes:
        folder = os.path.join(workdir, size_label(size).split(",")[0].replace(" ", "_"))  # e.g. d_model_16
        theirs = reference_side(code, prepro_dir, folder, size)
        rows += size_rows(code, theirs, prepro_dir)
    return rows + [bleu_row(code, prepro_dir, workdir)]


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
