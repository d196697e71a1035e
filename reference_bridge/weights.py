"""Moving weights between the reference's checkpoints and the port's: which variable is which
(weight_names), a reference checkpoint as a run of the port (from_reference, convert), and a port
model as a checkpoint of the reference's own code (to_reference)."""
import dataclasses
import json
import os
import re

import data_load
import hyperparams
from reference_bridge.launch import PROCESS, run_reference, write_inputs
from support.utils import UserError
from trained import checkpoints

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



# Each sublayer of a block (model.Transformer.sublayers) and the reference's variable scope for it
REFERENCE_SCOPES = {("encoder", "self_attention"): "multihead_attention",
                    ("encoder", "feed_forward"): "positionwise_feedforward",
                    ("decoder", "self_attention"): "self_attention",
                    ("decoder", "cross_attention"): "vanilla_attention",
                    ("decoder", "feed_forward"): "positionwise_feedforward"}


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

    for stack, i, name, sublayer, add_norm in model.sublayers():
        scope = f"{stack}/num_blocks_{i}/{REFERENCE_SCOPES[stack, name]}"
        (feed_forward if name == "feed_forward" else attention)(sublayer, scope)
        norm(add_norm, scope)
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


def same_pieces(vocab, prepro_dir, ckpt):
    """A UserError unless the reference's vocabulary file (vocab, its --vocab: a piece a line, a
    tab and a score after it or not) holds prepro_dir's pieces, in the same order: the same count
    is not the same vocabulary."""
    sp = data_load.load_vocab(prepro_dir)
    try:
        with open(vocab, encoding="utf-8") as f:
            theirs = [line.rstrip("\n").split("\t")[0] for line in f]
    except (OSError, TypeError) as e:
        raise UserError(f"--ckpt {ckpt}: the vocabulary its hparams file names ({vocab}) cannot be read ({e}); "
                        f"the pieces must be compared with --prepro_dir's") from None
    ours = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    differ = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), None)
    if differ is not None or len(theirs) != len(ours):
        where = (f"piece {differ} is {theirs[differ]!r} there, {ours[differ]!r} here" if differ is not None
                 else f"{len(theirs)} pieces there, {len(ours)} here")
        raise UserError(f"--prepro_dir {prepro_dir} is not the vocabulary the checkpoint was trained with ({vocab}: "
                        f"{where}): give the prepro folder the reference trained on")


def from_reference(ckpt, prepro_dir, logdir, kernels="plain", dropout_rate=None):
    """The port's model holding a reference checkpoint's weights, built with `kernels` (a --kernels
    value) and the checkpoint's dropout rate or dropout_rate, and its Hparams (port_settings)."""
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
    same_pieces(reference_hparams.get("vocab"), prepro_dir, ckpt)
    if dropout_rate is not None:
        hp = dataclasses.replace(hp, dropout_rate=dropout_rate)
    hp = dataclasses.replace(hp, kernels=kernels)
    model = transformer.compile_model(transformer.make_model(hp, vocab_size), hp)
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
    (reference_bridge/process/save_checkpoint.py, in its process); its prefix."""
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
    script = os.path.join(PROCESS, "save_checkpoint.py")
    files = write_inputs(prepro_dir, os.path.join(workdir, "data"))
    if run_reference(code, os.path.abspath(workdir), script, [weights, prefix, *files, *reference_args(hp)]) != 0:
        raise UserError(f"the reference's code could not save the weights (its output above); {workdir} holds them")
    return prefix

