"""The reference's own code, run as published beside the port: Kyubyong Park's `transformer` at
commit fb023bb (master, 2019-09-24), its train.py unedited, on today's TensorFlow.

    python reference.py train --reference_dir ../kyubyong-transformer --prepro_dir prepro/multi30k \\
        --workdir log/reference/multi30k -- --num_epochs 20 --d_model 256 --d_ff 1024 --num_blocks 3 \\
        --num_heads 4
    python reference.py convert --ckpt log/reference/multi30k/log/1/iwslt2016_E20L2.50-4540 \\
        --prepro_dir prepro/multi30k --logdir log/from_reference
    python reference.py export --logdir log/from_reference --prepro_dir prepro/multi30k \\
        --workdir log/to_reference --reference_dir ../kyubyong-transformer
    python reference.py check --prepro_dir prepro/sample --workdir log/reference/check \\
        --reference_dir ../kyubyong-transformer
    python reference.py curves --prepro_dir prepro/multi30k --workdir log/reference/curves \\
        --reference_dir ../kyubyong-transformer -- --warmup_steps 1000
    python reference.py curves --draw --workdir docs/reference_curves

`train` does this:
  - writes the ids of --prepro_dir (prepro.py's, the port's own) in the reference's input format
    into <workdir>/data/: its --train1/--train2/--eval1/--eval2 files (sentencepiece pieces
    separated by spaces, one sentence a line), --eval3 (the raw dev target text, which its BLEU
    is scored against) and --vocab (one piece a line, in id order);
  - runs the reference's train.py in <workdir>, in a process of its own where the substitutions of
    SUBSTITUTIONS (and only those) are made before the reference's first line runs, with those
    file arguments, --vocab_size, and the arguments after `--` passed on as they are.
The reference then writes what it always wrote, relative to <workdir>: log/1/ (checkpoints and
TensorBoard summaries; --logdir) and eval/1/ (each epoch's dev translations ending with their
multi-bleu.perl line; --evaldir). Its multi-bleu.perl is linked into <workdir>, where it runs it.

Without --reference_dir the public repository is cloned at that commit into <workdir>/code (git
and the network needed). The reference's code needs tf_keras (`bash setup.sh dev` installs it).

`export` goes the other way: a port run of the reference's choices (a converted one, or one trained
with the iwslt2016 preset) becomes a checkpoint of the reference's code, built and saved by that
code in its own process, which the reference's test.py restores.

`check` is the equality report, in a minute or two: the reference's code and the port, from the
same random weights at a tiny size, give the same logits, the same losses and weights over five
training steps, the same greedy translations, and the same BLEU (check() says how each is compared).

`curves` reproduces it all: the equality report first, on the ids it trains on (it stops there if a
row fails), then the reference's train.py and the port's multi30k_reference preset side by side (two
runs a side by default, hours on a CPU: docs/ablations.md says how many), and it draws their
training loss and dev BLEU by epoch in one picture, with a table and a verdict (reference_history
reads the reference's own summaries and translation files). Each run keeps its epochs in its
history.jsonl; `curves --draw` trains nothing and draws the runs as far as they have gone, and a run
finished on another machine joins by copying its history.jsonl into the same place under --workdir.

`convert` makes a run folder of the port from a reference checkpoint (the prefix its tf.train.Saver
wrote; its hparams file beside it gives the sizes): the iwslt2016 preset (every choice of the
reference's 2019 code) at the checkpoint's sizes, its weights in ckpt/ as an epoch checkpoint, and
--prepro_dir's vocabulary, which must be the one the reference trained with (`train` above wrote
its files from it). eval.py, translate.py, attention.py and export.py then use it as a run the port
trained. The port's outputs equal the reference's for the same weights (tests/test_reference.py;
PORTING.md says what differs and why it changes nothing at real tokens).
"""
import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import typing

import checkpoints
import data_load
import hyperparams
from utils import UserError, run_cli

REPOSITORY = "https://github.com/Kyubyong/transformer"
COMMIT = "fb023bb097e08d53baf25b46a9da490beba51a21"  # master, "removed query masking", 2019-09-24
# Every change made for today's TensorFlow, in the reference's process only: (what its code names,
# what stands in for it). No line of its files is edited.
SUBSTITUTIONS = (
    ("tensorflow (`import tensorflow as tf`)",
     "tensorflow.compat.v1 with TensorFlow 2's behaviour turned off (tf.disable_v2_behavior()): sessions, "
     "graphs, variable scopes and tf.train as in TensorFlow 1"),
    ("tf.contrib.layers.xavier_initializer", "tf.glorot_uniform_initializer, the same distribution (TensorFlow 2 "
                                             "has no tf.contrib)"),
    ("tf.layers (dense, dropout)", "tf_keras's TensorFlow 1 layers (TF_USE_LEGACY_KERAS=1): Keras 3 has none"),
)
# Run in the reference's process: the substitutions above, then its script as __main__.
LAUNCHER = """
import os, runpy, sys, types
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow.compat.v1 as tf
tf.disable_v2_behavior()
tf.layers.dense, tf.layers.dropout  # load tf_keras's TensorFlow 1 layers before tensorflow is replaced
tf.contrib = types.SimpleNamespace(layers=types.SimpleNamespace(xavier_initializer=tf.glorot_uniform_initializer))
sys.modules["tensorflow"] = tf
code, script = sys.argv[1], os.path.join(sys.argv[1], sys.argv[2])  # one of the reference's, or a path
sys.path[:0] = [code, os.path.dirname(script)]  # the reference's modules first, then those beside the script
sys.argv = [script] + sys.argv[3:]
runpy.run_path(script, run_name="__main__")
"""
FILES = ("train.py", "model.py", "modules.py", "data_load.py", "utils.py", "hparams.py", "multi-bleu.perl")


def reference_code(reference_dir, workdir):
    """The folder of the reference's files: reference_dir, checked, or a clone at COMMIT."""
    if reference_dir is None:
        reference_dir = os.path.join(workdir, "code")
        if not os.path.isdir(reference_dir):
            for command in (["git", "clone", "--quiet", REPOSITORY, reference_dir],
                            ["git", "-C", reference_dir, "checkout", "--quiet", COMMIT]):
                if subprocess.run(command).returncode != 0:
                    raise UserError(f"{' '.join(command)} failed: clone {REPOSITORY} yourself and pass "
                                    f"--reference_dir")
    missing = [name for name in FILES if not os.path.isfile(os.path.join(reference_dir, name))]
    if missing:
        raise UserError(f"--reference_dir {reference_dir}: no {', '.join(missing)}; give the folder of a "
                        f"clone of {REPOSITORY} at commit {COMMIT[:7]}")
    return os.path.abspath(reference_dir)


def write_inputs(prepro_dir, folder):
    """The split files and vocabulary of prepro_dir in the reference's format, in folder; the
    reference's file arguments for them."""
    sp = data_load.load_vocab(prepro_dir)
    meta = data_load.load_meta(prepro_dir)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    os.makedirs(folder, exist_ok=True)

    def write(name, lines):
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
        return path

    args = ["--vocab", write("bpe.vocab", pieces), "--vocab_size", str(len(pieces))]
    for split, flags in (("train", ("--train1", "--train2")), ("dev", ("--eval1", "--eval2"))):
        sides = zip(flags, (meta["src_lang"], meta["tgt_lang"]), data_load.load_split(prepro_dir, split))
        for flag, lang, ids in sides:
            args += [flag, write(f"{split}.{lang}.bpe", (" ".join(pieces[i] for i in row) for row in ids))]
    args += ["--eval3", write(f"dev.{meta['tgt_lang']}", data_load.load_text(prepro_dir, "dev", meta["tgt_lang"]))]
    return args


def run_reference(code, workdir, script, args):
    """Run the reference's script with args in workdir, in its own process (LAUNCHER); its exit status."""
    link = os.path.join(workdir, "multi-bleu.perl")
    if not os.path.exists(link):
        os.symlink(os.path.join(code, "multi-bleu.perl"), link)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    return subprocess.run([sys.executable, "-c", LAUNCHER, code, script, *args], cwd=workdir, env=env).returncode


# The port's settings whose values the reference's code fixes, beside those of modules.Choices
FIXED = ("positional", "output_vocab", "share_embeddings", "attention_dropout")
# The reference's hparams that the port's settings take at the checkpoint's values (the same names)
SIZES = ("vocab_size", "d_model", "d_ff", "num_blocks", "num_heads", "maxlen1", "maxlen2", "dropout_rate", "smoothing",
         "lr", "warmup_steps", "num_epochs")


def port_settings(reference_hparams, prepro_dir, logdir):
    """The port's Hparams for a reference run: the iwslt2016 preset (the reference's 2019 choices)
    with the run's sizes, its batch of sentences, and prepro_dir's languages."""
    meta = data_load.load_meta(prepro_dir)
    return dataclasses.replace(hyperparams.preset("iwslt2016"), prepro_dir=prepro_dir, logdir=logdir,
                               src_lang=meta["src_lang"], tgt_lang=meta["tgt_lang"],
                               batch_sentences=int(reference_hparams["batch_size"]),
                               **{name: type(getattr(hyperparams.Hparams(), name))(reference_hparams[name])
                                  for name in SIZES})


def reference_args(hp):
    """The reference's hparams.py arguments for the port's settings hp: its sizes (SIZES, but the
    vocabulary's, which write_inputs gives) and its batch of sentences."""
    return [f"--{name}={getattr(hp, name)}" for name in SIZES if name != "vocab_size"] + [
        f"--batch_size={hp.batch_sentences}"]


def train_reference(code, files, workdir, args):
    """Run the reference's train.py in workdir on the files write_inputs wrote, with args after them."""
    os.makedirs(workdir, exist_ok=True)
    print(f"the reference's train.py ({code}) in {workdir}, with: {' '.join(files + args)}", flush=True)
    status = run_reference(code, os.path.abspath(workdir), "train.py",
                           [os.path.abspath(a) if os.path.isfile(a) else a for a in files] + args)
    if status != 0:
        raise UserError(f"the reference's train.py stopped with exit status {status} (its output above)")


def weight_names(model):
    """[(the port's variable, the name of the reference's)] for every weight of a model built with
    port_settings. The reference's feed-forward dense kernels (d, f) are the port's kernel-size-1
    convolutions (1, d, f): the same numbers."""
    names = [(model.embedding.embeddings, "shared_weight_matrix/weight_mat")]

    def attention(mha, scope):  # Q, K, V: dense, dense_1, dense_2 (no W^O in the reference)
        for dense, name in ((mha.query_dense, "dense"), (mha.key_dense, "dense_1"), (mha.value_dense, "dense_2")):
            names.extend([(dense.kernel, f"{scope}/{name}/kernel"), (dense.bias, f"{scope}/{name}/bias")])

    def norm(add_norm, scope):
        names.extend([(add_norm.norm.gamma, f"{scope}/ln/gamma"), (add_norm.norm.beta, f"{scope}/ln/beta")])

    def feed_forward(ffn, scope):
        for conv, name in ((ffn.inner, "dense"), (ffn.outer, "dense_1")):
            names.extend([(conv.kernel, f"{scope}/{name}/kernel"), (conv.bias, f"{scope}/{name}/bias")])

    for i, block in enumerate(model.encoder_blocks):
        scope = f"encoder/num_blocks_{i}"
        attention(block.self_attention, f"{scope}/multihead_attention")
        norm(block.self_attention_norm, f"{scope}/multihead_attention")
        feed_forward(block.feed_forward, f"{scope}/positionwise_feedforward")
        norm(block.feed_forward_norm, f"{scope}/positionwise_feedforward")
    for i, block in enumerate(model.decoder_blocks):
        scope = f"decoder/num_blocks_{i}"
        for layer, add_norm, name in ((block.self_attention, block.self_attention_norm, "self_attention"),
                                      (block.cross_attention, block.cross_attention_norm, "vanilla_attention")):
            attention(layer, f"{scope}/{name}")
            norm(add_norm, f"{scope}/{name}")
        feed_forward(block.feed_forward, f"{scope}/positionwise_feedforward")
        norm(block.feed_forward_norm, f"{scope}/positionwise_feedforward")
    return names


def weight_pairs(model, tensor):
    """[(the port's variable, the reference's value, in the variable's shape)] for every weight of
    a model built with port_settings; tensor(name) reads one of the reference's variables."""
    import numpy as np

    return [(variable, np.reshape(tensor(name), variable.shape)) for variable, name in weight_names(model)]


def matched_names(model):
    """weight_names(model), after checking that every trainable weight of the model has one: a
    UserError naming those that have none (a model of other choices than the reference's)."""
    names = weight_names(model)
    left = {id(v) for v in model.trainable_weights} - {id(v) for v, _ in names}
    if left:
        listed = ", ".join(v.path for v in model.trainable_weights if id(v) in left)
        raise UserError(f"the port's {listed} have no counterpart in the reference's model (its choices differ "
                        f"from the reference's: the iwslt2016 preset's)")
    return names


def from_reference(ckpt, prepro_dir, logdir):
    """The port's model holding a reference checkpoint's weights, and its Hparams (port_settings)."""
    import tensorflow as tf

    import model as transformer

    folder = os.path.dirname(ckpt)
    try:
        with open(os.path.join(folder, "hparams"), encoding="utf-8") as f:
            reference_hparams = json.load(f)
        reader = tf.train.load_checkpoint(ckpt)
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise UserError(f"--ckpt {ckpt}: not a reference checkpoint with its hparams file beside it ({e})") from None
    hp = port_settings(reference_hparams, prepro_dir, logdir)
    vocab_size = data_load.load_meta(prepro_dir)["vocab_size"]
    if vocab_size != hp.vocab_size:
        raise UserError(f"--prepro_dir {prepro_dir} has {vocab_size} pieces, the checkpoint {hp.vocab_size}: give the "
                        f"prepro folder the reference trained on")
    model = transformer.compile_model(transformer.make_model(dataclasses.replace(hp, kernels="plain"), vocab_size), hp)
    names = matched_names(model)
    for variable, name in names:
        value = reader.get_tensor(name)
        if tuple(variable.shape) not in (value.shape, (1, *value.shape)):  # (1, d, f): a dense kernel (d, f)
            raise UserError(f"--ckpt {ckpt}: {variable.path} is {tuple(variable.shape)} in the port, "
                            f"{value.shape} there")
        variable.assign(value.reshape(variable.shape))
    if reader.has_tensor("global_step"):
        model.optimizer.iterations.assign(int(reader.get_tensor("global_step")))
    return model, hp


def convert(ckpt, prepro_dir, logdir):
    """A run folder of the port in logdir from a reference checkpoint: hparams.json, vocab/, and the
    weights as ckpt/E<epoch>L<loss>B0.00.keras, epoch and training loss read from the reference's
    own checkpoint name (iwslt2016_E<epoch>L<loss>-<step>; epoch 1, loss 0.00 for other names; no
    dev BLEU is known); its path."""
    model, hp = from_reference(ckpt, prepro_dir, logdir)
    hyperparams.save_hparams(hp, logdir)
    checkpoints.keep_vocabulary(prepro_dir, logdir)
    named = re.search(r"E(\d+)L([\d.]+)-\d+$", os.path.basename(ckpt))
    epoch, loss = (int(named.group(1)), named.group(2)) if named else (1, "0.00")
    path = os.path.join(logdir, "ckpt", f"E{epoch:02d}L{loss}B0.00.keras")
    checkpoints.save(model, path, checkpoints.training_state(model, logdir, epoch, 0, 0.0, 0.0))
    step = int(model.optimizer.iterations.numpy())
    print(f"converted {ckpt} (step {step}) -> {path}, settings {os.path.join(logdir, 'hparams.json')}")
    return path


def to_reference(model, hp, prepro_dir, code, workdir):
    """Write model (of port_settings' choices, e.g. a run converted by `convert`, or trained with the
    iwslt2016 preset) as a checkpoint of the reference's own code: <workdir>/ckpt/port-<step>, with
    the reference's hparams file beside it (its sizes, and the vocabulary and files write_inputs
    writes into <workdir>/data). The reference's model is built and saved by its own code
    (reference_process/save_checkpoint.py, in its process); its prefix."""
    import numpy as np

    import model as transformer

    reference_choices = {name: getattr(hyperparams.preset("iwslt2016"), name)
                         for name in (*FIXED, *transformer.CHOICE_FIELDS)}
    differ = [f"--{name} {getattr(hp, name)} (the reference: {value})" for name, value in reference_choices.items()
              if getattr(hp, name) != value]
    if differ:
        raise UserError(f"the reference's code cannot hold this model: {'; '.join(differ)}")
    names = matched_names(model)
    os.makedirs(os.path.join(workdir, "ckpt"), exist_ok=True)
    weights = os.path.join(workdir, "ckpt", "weights.npz")
    values = {name: np.asarray(variable) for variable, name in names}
    np.savez(weights, **{name: value[0] if value.ndim == 3 else value  # (1, d, f) convolutions: dense (d, f)
                         for name, value in values.items()})
    step = int(model.optimizer.iterations.numpy()) if model.optimizer is not None else 0
    prefix = os.path.abspath(os.path.join(workdir, "ckpt", f"port-{step}"))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_process", "save_checkpoint.py")
    files = write_inputs(prepro_dir, os.path.join(workdir, "data"))
    if run_reference(code, os.path.abspath(workdir), script, [weights, prefix, *files, *reference_args(hp)]) != 0:
        raise UserError(f"the reference's code could not save the weights (its output above); {workdir} holds them")
    return prefix


def compare_line(theirs, ours):
    """One dev line of the reference's greedy translation (as its utils.postprocess writes it)
    against the port's (decoded the same way): (differs, cut, words compared). The reference's
    argmax may choose <pad> or <s>, which the port's never does; until then both choose the same
    tokens, so such a line is compared up to that token (cut)."""
    head = re.split("<pad>|<s>", theirs)[0].rstrip()  # the whole line when it holds neither
    cut = head != theirs.rstrip()
    differs = not ours.startswith(head) if cut else ours != theirs.strip()
    return differs, cut, len(head.split())


def greedy_differences(theirs, model, hp, prepro_dir):
    """The reference's dev translations (theirs: the lines its test.py or train.py wrote) against
    the port's uncached greedy decoding of dev with model, line by line (compare_line): (lines
    compared, lines that differ, lines compared up to a <pad> or <s> of the reference's, words
    compared)."""
    import numpy as np

    import decoding
    sp = data_load.load_vocab(prepro_dir)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    dev, _ = data_load.load_split(prepro_dir, "dev")
    ours = decoding.greedy_decode(model, data_load.encoder_inputs(dev, multiple=1), max_len=hp.maxlen2, cached=False)
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


def check(code, prepro_dir, workdir, steps=5, sentences=8):
    """The port computes the reference's numbers: the reference's own code (code, run in its process)
    and the port (from_reference) from the same random weights, at a tiny size, on prepro_dir's
    data; the rows of the report (Row), every one ok when they agree.

    1. Logits: the first batch's, in inference mode, at every target position that is not padding.
    2. Training: `steps` steps of each side's own training (the reference's train(): its loss,
       noam_scheme, tf.train.AdamOptimizer; the port: the iwslt2016 preset's loss, schedule and Adam,
       compiled by from_reference) on the same batches of `sentences` pairs, dropout off: each
       step's loss, and every weight after each step, within TOLERANCE or within twice the port's
       own float32 noise (the port trained again with XLA), whichever is larger. The attention's
       key biases are reported apart: q . b_k is the same for every key, so the softmax ignores
       them and their true gradient is 0; Adam turns each engine's rounding noise into tiny steps
       of its own.
    3. Greedy decoding: the trained weights, written as the reference's checkpoint (to_reference),
       restored by its own test.py, which translates dev: its lines and the port's uncached greedy
       decoding of dev, line by line. The reference's argmax may choose <pad> or <s>, which the
       port's never does: such a line is compared up to that token (counted).
    4. BLEU: the reference's multi-bleu.perl and the port's "reference's way" (scoring.bleu_scores)
       on dev's references and the same sentences with a fifth of their words dropped."""
    import numpy as np
    from keras import ops

    from scoring import bleu_scores

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
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_process", "check.py")
    if run_reference(code, workdir, script, [os.path.join(workdir, "batches.npz"), out, *files, *sizes,
                                             *CHECK_TRAINING, "--logdir", logdir]) != 0:
        raise UserError("the reference's code stopped (its output above)")
    want = np.load(out)
    model, hp = from_reference(os.path.join(logdir, "random-0"), prepro_dir, os.path.join(workdir, "port"))
    # The port's own float32 noise: the same steps from the same weights, compiled by XLA (the same
    # sums in another order). Adam divides each weight's gradient by that weight's own history, so
    # where a gradient is small beside the terms it is summed from, their rounding grows into the
    # step; with thousands of pieces this reaches 1e-5 in five steps. A bound below it tests noise.
    again, _ = from_reference(os.path.join(logdir, "random-0"), prepro_dir, os.path.join(workdir, "port_xla"))
    again.jit_compile = not model.jit_compile
    again.make_train_function(force=True)

    (x, d), y = batches[0]
    logits = ops.convert_to_numpy(model((x, d), training=False))  # (N, T2, V)
    real = y != 0
    rows = [within("logits of the first batch at real target positions, largest difference",
                   np.abs(logits[real] - want["0:logits"][real]).max(), TOLERANCE)]
    names = weight_names(model)
    before = [np.array(variable) for variable, _ in names]
    key_biases = 0.0
    for k, ((x, d), y) in enumerate(batches, 1):
        loss = float(model.train_on_batch((x, d), y))
        again.train_on_batch((x, d), y)
        rows.append(within(f"step {k}: the loss, difference", abs(loss - float(want[f"{k}:loss"])), TOLERANCE))
        largest = own = 0.0
        for (variable, value), (other, _) in zip(weight_pairs(model, lambda name, k=k: want[f"{k}:{name}"]),
                                                 weight_names(again)):
            ours = np.array(variable)
            if variable.path.endswith("key/bias"):
                key_biases = max(key_biases, np.abs(ours).max(), np.abs(value).max())
            else:
                largest = max(largest, np.abs(ours - value).max())
                own = max(own, np.abs(ours - np.array(other)).max())
        rows.append(within(f"step {k}: every weight but the key biases, largest difference (the port against itself "
                           f"with XLA: {own:.3g}; the bound: {TOLERANCE:g}, or twice that if larger)",
                           largest, max(TOLERANCE, 2 * own)))
    rows.append(within("the attention's key biases (true gradient 0), largest value on either side", key_biases, 1e-3))
    moved = max(np.abs(np.array(variable) - b).max() for (variable, _), b in zip(names, before))
    rows.append(Row("the steps moved the weights by (largest change)", float(moved)))

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
    compared, differ, cut, words = greedy_differences(theirs, model, hp, prepro_dir)
    rows.append(within(f"greedy translations of dev: lines that differ, of the {compared} compared ({words} words; "
                       f"{cut} up to where its argmax chose <pad> or <s>)", differ, 0))
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


CURVES_PRESET = "multi30k_reference"  # the reference's choices at Multi30k's size


def reference_history(run_dir, prepro_dir):
    """The epochs of a run of the reference's train.py in run_dir (its log/1 and eval/1), as the
    port's history.jsonl holds them: train_loss, the mean of the loss its summaries recorded at
    each step of the epoch (with dropout, as it trained); dev_bleu and dev_bleu_reference, its dev
    translation file scored by the project's scoring (sacreBLEU, and the reference's way);
    multi_bleu, the figure its own multi-bleu.perl appended to the file (None where it printed none)."""
    import glob
    import math

    import tensorflow as tf

    from scoring import bleu_scores
    with open(os.path.join(run_dir, "log", "1", "hparams"), encoding="utf-8") as f:
        settings = json.load(f)
    with open(settings["train1"], encoding="utf-8") as f:
        per_epoch = math.ceil(sum(1 for _ in f) / settings["batch_size"])  # its calc_num_batches
    losses = {}
    for events in sorted(glob.glob(os.path.join(run_dir, "log", "1", "events.out.tfevents.*"))):
        records = tf.compat.v1.train.summary_iterator(events)
        while True:
            try:
                event = next(records)
            except (StopIteration, tf.errors.DataLossError):  # the end, or a last record cut short
                break  # (a run stopped, or still writing)
            losses.update((event.step, v.simple_value) for v in event.summary.value if v.tag == "loss")
    references = data_load.load_text(prepro_dir, "dev", data_load.load_meta(prepro_dir)["tgt_lang"])
    history = []
    for epoch in range(1, settings["num_epochs"] + 1):
        written = glob.glob(os.path.join(run_dir, "eval", "1", f"iwslt2016_E{epoch:02d}L*"))
        if not written:
            break
        with open(written[0], encoding="utf-8") as f:
            lines = f.read().split("\n")
        hypotheses, report = lines[:len(references)], "\n".join(lines[len(references):])
        scores = bleu_scores(hypotheses, references)
        found = re.search(r"BLEU = ([\d.]+)", report)
        steps = [losses[step] for step in range((epoch - 1) * per_epoch + 1, epoch * per_epoch + 1) if step in losses]
        history.append(dict(epoch=epoch, train_loss=sum(steps) / len(steps) if steps else None,
                            dev_bleu=scores["sacrebleu"], dev_bleu_reference=scores["reference"],
                            multi_bleu=float(found.group(1)) if found else None))
    return history


def curves_table(reference_runs, port_runs):
    """Markdown: per epoch the mean over each side's runs of the training loss and dev BLEU both
    ways, then the last epoch's figures run by run, and the verdict: each metric's means, spreads
    (largest minus smallest run) and the difference, and what that many runs a side can show."""
    import statistics

    def mean(runs, epoch, key):
        values = [h[epoch - 1][key] for h in runs if len(h) >= epoch and h[epoch - 1].get(key) is not None]
        return f"{statistics.mean(values):.2f}" if values else ""

    epochs = max(len(h) for h in reference_runs + port_runs)
    lines = ["| epoch | train loss, reference | train loss, port | dev BLEU (sacreBLEU), reference | "
             "dev BLEU (sacreBLEU), port | dev BLEU (the reference's way), reference | "
             "dev BLEU (the reference's way), port |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for epoch in range(1, epochs + 1):
        lines.append(f"| {epoch} | " + " | ".join(mean(runs, epoch, key) for key in ("train_loss", "dev_bleu",
                                                                                     "dev_bleu_reference")
                                                    for runs in (reference_runs, port_runs)) + " |")
    lines += ["", "The last epoch, run by run (its multi-bleu.perl's own figure beside the reference's):", "",
              "| run | epochs | dev BLEU (sacreBLEU) | dev BLEU (the reference's way) | multi-bleu.perl |",
              "|---|---:|---:|---:|---:|"]
    for side, runs in (("reference run", reference_runs), ("port seed", port_runs)):
        for number, history in enumerate(runs, 1):
            last = history[-1] if history else {}
            multi = last.get("multi_bleu")
            lines.append(f"| {side} {number} | {len(history)} | {last.get('dev_bleu', float('nan')):.2f} | "
                         f"{last.get('dev_bleu_reference', float('nan')):.2f} | "
                         f"{'' if multi is None else f'{multi:.2f}'} |")
    verdicts = []
    for key, metric in (("dev_bleu", "sacreBLEU"), ("dev_bleu_reference", "the reference's way")):
        finals = [[h[-1][key] for h in runs if h] for runs in (reference_runs, port_runs)]
        if not all(finals):
            continue
        ref, port = (statistics.mean(f) for f in finals)
        spreads = {side: max(f) - min(f) for side, f in zip(("the reference's runs", "the port's seeds"), finals)
                   if len(f) > 1}  # largest minus smallest run, where a side has more than one
        if len(spreads) == 2:
            measured = f" against runs that differ among themselves by up to {max(spreads.values()):.2f}"
        elif spreads:
            ((side, spread),) = spreads.items()
            measured = f"; {side} differ by {spread:.2f}, the other side's one run has no spread to measure"
        else:
            measured = ", with one run on a side: nothing to measure how far runs differ"
        verdicts.append(f"{metric}: the reference {ref:.2f} (runs {', '.join(f'{v:.2f}' for v in finals[0])}), the "
                        f"port {port:.2f} (seeds {', '.join(f'{v:.2f}' for v in finals[1])}), a difference of "
                        f"{port - ref:+.2f}{measured}")
    runs = min(len(reference_runs), len(port_runs))
    at = ("at the last epoch" if len({len(h) for h in reference_runs + port_runs}) == 1 else
          "at each run's last epoch so far (the runs have not all reached the same epoch)")
    lines += ["", f"Dev BLEU {at}, " + "; ".join(verdicts) + ". " +
              (f"With {runs} runs a side, a difference within the runs' own spread cannot be told from the "
               f"variation between runs, and a larger one is a sign, not a measured effect: it would take more runs "
               f"to put an interval on it." if runs > 1 else
               f"One run {'a side' if len(reference_runs) == len(port_runs) else 'on one side'}: nothing here can "
               f"be told from the variation between runs.")]
    return "\n".join(lines) + "\n"


def recorded(path):
    """The epochs of a run's history.jsonl, [] where there is none yet."""
    import pictures

    return pictures.read_history(path) if os.path.exists(path) else []


def curves(code, prepro_dir, workdir, runs, args, draw=False):
    """The reference's unedited train.py and the port's CURVES_PRESET, `runs` runs a side on
    prepro_dir's ids, args going to both (e.g. --warmup_steps 1000), after the equality report on
    those ids while a run is unfinished (<workdir>/check; UserError if a row fails):
    <workdir>/reference/run<N> and <workdir>/port/seed<N>, then <workdir>/curves.png (every run's
    training loss and dev BLEU by epoch, pictures.plot_runs) and <workdir>/curves.md (curves_table).
    Every run keeps its epochs in its own history.jsonl (the reference's written from its logs by
    reference_history), and a run whose history.jsonl holds every epoch is finished, its logs there
    or not: runs made on other machines join by that file. A stopped run resumes from its newest
    checkpoint. draw: train nothing (code, prepro_dir and args unused but to read a reference run's
    logs), and draw the runs as far as they have gone."""
    import pictures

    hp = dataclasses.replace(hyperparams.preset(CURVES_PRESET), prepro_dir=prepro_dir)
    files = None if draw else write_inputs(prepro_dir, os.path.join(workdir, "data"))
    wanted = epochs_in(args, hp.num_epochs)  # a run with this many epochs is finished
    folders = [(os.path.join(workdir, "reference", f"run{number}"), os.path.join(workdir, "port", f"seed{number}"))
               for number in range(1, runs + 1)]
    kept = {folder: recorded(os.path.join(folder, "history.jsonl")) for pair in folders for folder in pair}
    if not draw and any(len(history) < wanted for history in kept.values()):
        # a minute or two that proves, on these ids, what the hours of training will compare
        if equality_report(code, prepro_dir, os.path.join(workdir, "check")):
            raise UserError(f"the reference's code and the port do not compute the same numbers on {prepro_dir} "
                            f"(the report above, its files in {os.path.join(workdir, 'check')}): the curves would "
                            f"compare two different programs; see PORTING.md")
    reference_runs, port_runs = [], []
    for number, (run_dir, logdir) in enumerate(folders, 1):
        saved = os.path.join(run_dir, "history.jsonl")
        history = kept[run_dir]
        if len(history) < wanted and os.path.exists(os.path.join(run_dir, "log", "1", "hparams")):
            if prepro_dir is None:
                raise UserError(f"{run_dir} has the reference's logs but no finished history.jsonl: give "
                                f"--prepro_dir (the ids it trained on) to score its translation files")
            history = reference_history(run_dir, prepro_dir)
        if len(history) < wanted and not draw:
            train_reference(code, files, run_dir, [*reference_args(hp), *args])
            history = reference_history(run_dir, prepro_dir)
        if history and history != kept[run_dir]:
            with open(saved, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(epoch) + "\n" for epoch in history)
        reference_runs.append(history)
        saved = os.path.join(logdir, "history.jsonl")
        history = kept[logdir]
        if len(history) < wanted and not draw:
            command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"),
                       "--preset", CURVES_PRESET, "--prepro_dir", prepro_dir, "--logdir", logdir, "--seed", str(number),
                       *args]
            print(" ".join(command), flush=True)
            if subprocess.run(command).returncode != 0:
                raise UserError(f"train.py stopped for {logdir} (its output above)")
            history = recorded(saved)
        port_runs.append(history)
    reference_runs, port_runs = [h for h in reference_runs if h], [h for h in port_runs if h]
    if not reference_runs or not port_runs:
        raise UserError(f"{workdir}: no epoch of {'the reference' if not reference_runs else 'the port'} to draw "
                        f"yet (reference/run<N>/ and port/seed<N>/ hold the runs)")
    compared = ("epoch", "train_loss", "dev_bleu", "dev_bleu_reference")  # what both sides measure
    named = [(f"{side} {n}", [{key: e.get(key) for key in compared} for e in history])
             for side, runs in (("reference run", reference_runs), ("port seed", port_runs))
             for n, history in enumerate(runs, 1)]
    pictures.plot_runs(named, os.path.join(workdir, "curves.png"))
    table = curves_table(reference_runs, port_runs)
    settings = "" if draw else (f"Both trained on {prepro_dir}; settings given to both: "
                                f"{' '.join(args) or 'none'}.\n\n")
    with open(os.path.join(workdir, "curves.md"), "w", encoding="utf-8") as f:
        f.write(f"# The reference's code (commit {COMMIT[:7]}, 2019-09-24) beside the port's {CURVES_PRESET}\n\n"
                + settings + table)
    print(table, end="")
    print(f"wrote {os.path.join(workdir, 'curves.png')} and {os.path.join(workdir, 'curves.md')}")


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


def epochs_in(args, default):
    """The --num_epochs among args (the last one given wins, as in argparse), else default."""
    value = default
    for i, arg in enumerate(args):
        if arg == "--num_epochs" and i + 1 < len(args):
            value = int(args[i + 1])
        elif arg.startswith("--num_epochs="):
            value = int(arg.split("=", 1)[1])
    return value


def reference_dir_option(parser):
    parser.add_argument("--reference_dir", metavar="PATH",
                        help=f"a clone of {REPOSITORY} at commit {COMMIT[:7]} (default: cloned into <workdir>/code)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Substitutions made in the reference's process: "
               + "; ".join(f"{name} -> {what}" for name, what in SUBSTITUTIONS))
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run the reference's train.py on prepro.py's ids",
                                epilog="Arguments after -- go to the reference's train.py (its hparams.py lists them).")
    reference_dir_option(train)
    train.add_argument("--prepro_dir", required=True, metavar="PATH", help="prepro.py's output to train on")
    train.add_argument("--workdir", required=True, metavar="PATH",
                       help="where the reference runs: its data/, log/1/ and eval/1/ go there")
    to_port = commands.add_parser("convert", help="a reference checkpoint as a run folder of the port")
    to_port.add_argument("--ckpt", required=True, metavar="PREFIX",
                         help="the checkpoint's prefix, e.g. log/1/iwslt2016_E20L2.50-4540 (its hparams file "
                              "beside it)")
    to_port.add_argument("--prepro_dir", required=True, metavar="PATH", help="the prepro.py folder it was trained on")
    to_port.add_argument("--logdir", required=True, metavar="PATH", help="the run folder to write")
    to_reference_parser = commands.add_parser("export", help="a port run (of the reference's choices) as a reference "
                                                             "checkpoint")
    to_reference_parser.add_argument("--logdir", required=True, metavar="PATH", help="the port's run folder")
    to_reference_parser.add_argument("--prepro_dir", required=True, metavar="PATH",
                                     help="the prepro.py folder it was trained on")
    to_reference_parser.add_argument("--workdir", required=True, metavar="PATH",
                                     help="where the checkpoint (ckpt/port-<step>) and the reference's data go")
    reference_dir_option(to_reference_parser)
    checker = commands.add_parser("check", help="the equality report: the reference's code and the port from the "
                                                "same random weights compute the same numbers (a minute or two)")
    checker.add_argument("--prepro_dir", required=True, metavar="PATH",
                         help="prepro.py's output whose data the check uses (e.g. the sample's)")
    checker.add_argument("--workdir", required=True, metavar="PATH", help="where its files go")
    reference_dir_option(checker)
    curves_parser = commands.add_parser(
        "curves", help=f"the equality report on --prepro_dir's ids (as check), then the reference's train.py and "
                       f"the port's --preset {CURVES_PRESET}, the same runs a side, their curves in one picture "
                       f"and table (hours)",
        epilog=f"Arguments after -- go to both sides' training (settings both take: e.g. --warmup_steps 1000); "
               f"the reference gets the {CURVES_PRESET} preset's sizes and batch of sentences. Stopped, it "
               f"starts again where it was: finished runs are kept, and each side resumes from its newest "
               f"checkpoint.")
    curves_parser.add_argument("--prepro_dir", metavar="PATH",
                               help="prepro.py's output to train on (the preset's: prepro/multi30k); with --draw, "
                                    "needed only to read a reference run that has its logs and no finished "
                                    "history.jsonl")
    curves_parser.add_argument("--workdir", required=True, metavar="PATH",
                               help="where the runs (reference/run<N>, port/seed<N>), curves.png and curves.md go")
    curves_parser.add_argument("--runs", type=int, default=2, metavar="N", help="runs a side (default 2)")
    curves_parser.add_argument("--draw", action="store_true",
                               help="train nothing: draw curves.png and curves.md from the runs in --workdir as far "
                                    "as they have gone (their history.jsonl, or a reference run's logs)")
    reference_dir_option(curves_parser)
    args = parser.parse_args(own)
    if args.command == "curves" and args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.command == "curves" and not args.draw and not args.prepro_dir:
        parser.error("curves needs --prepro_dir (the ids to train on), unless it only draws (--draw)")
    if args.command == "curves" and args.draw:
        if rest:
            parser.error("curves --draw trains nothing and takes no arguments after --")
        curves(None, args.prepro_dir, args.workdir, args.runs, [], draw=True)
        return
    if args.command == "check":
        if rest:
            parser.error("check takes no arguments after --")
        os.makedirs(args.workdir, exist_ok=True)
        return 1 if equality_report(reference_code(args.reference_dir, args.workdir), args.prepro_dir,
                                    args.workdir) else 0
    if args.command == "export":
        import runs

        if rest:
            parser.error("export takes no arguments after --")
        hp = dataclasses.replace(hyperparams.load_hparams(args.logdir), logdir=args.logdir, kernels="plain")
        model, _, ckpt = runs.load_trained(hp)
        os.makedirs(args.workdir, exist_ok=True)
        prefix = to_reference(model, hp, args.prepro_dir, reference_code(args.reference_dir, args.workdir),
                              args.workdir)
        print(f"{ckpt} -> {prefix} (the reference's test.py restores it: --ckpt {prefix})")
        return
    if args.command == "convert":
        if rest:
            parser.error("convert takes no arguments after --")
        convert(args.ckpt, args.prepro_dir, args.logdir)
        return
    os.makedirs(args.workdir, exist_ok=True)
    code = reference_code(args.reference_dir, args.workdir)
    if args.command == "curves":
        curves(code, args.prepro_dir, args.workdir, args.runs, rest)
        return
    train_reference(code, write_inputs(args.prepro_dir, os.path.join(args.workdir, "data")), args.workdir, rest)


if __name__ == "__main__":
    sys.exit(run_cli(main))
