"""A trained run, from Python: load it, translate with it, look inside it.

    from trained.runs import Translator
    translator = Translator("log/multi30k")
    translator.translate(["Ein Hund läuft.", "Zwei Kinder spielen."], beam_size=4)

A run is a log directory: its settings (hparams.json), its vocabulary (vocab/) and its checkpoints
(ckpt/). eval.py, translate.py, attention.py and export.py are command lines over this module.
"""
import dataclasses
import gc
import os
import re

from trained import checkpoints
import data_load
import hyperparams
from support.utils import UserError, compile_cache_while_keras_starts

# A trained run translates, is scored and is looked into in float32, whatever precision it trained
# in: its weights are float32 either way, and under mixed bfloat16 every step of a decoding loop
# casts them all again, which made translating slower on the CPUs measured (docs/speed.md)
USE_DTYPE = "float32"


def load_trained(hp, ckpt=None, preset=None):
    """The model of a run and its vocabulary (the run's own copy in <logdir>/vocab; hp.prepro_dir's
    for runs from before it existed): the checkpoint ckpt if given, else the mean of the newest
    hp.average_last epoch checkpoints of hp.logdir (as many as there are, if fewer; 1: the newest
    alone), or with hp.average_every of its snapshots (chosen_snapshots), in USE_DTYPE. preset: the
    --preset given, if one was (for the hint when there is no checkpoint).

    Returns:
      (model, sentencepiece processor, name of what was loaded: for a mean, the newest checkpoint's
      name with _avg<N>).
    """
    found = checkpoints.epoch_checkpoints(hp.logdir)
    if ckpt is None and not found:
        raise UserError(f"{os.path.join(hp.logdir, 'ckpt')}: no checkpoint; train first "
                        f"({hyperparams.train_first(hp.logdir, preset)}) or pass --ckpt")
    sp, meta = checkpoints.vocabulary(hp.logdir, hp.prepro_dir)
    if ckpt is not None:
        paths = [ckpt]
    elif hp.average_every:
        paths = chosen_snapshots(hp)
    else:
        paths = [p for _, p in found[-hp.average_last:]]
    # Keras starts in checkpoints.load: a second process on the same lines compiles nothing again
    with compile_cache_while_keras_starts(hp) as folder:
        if len(paths) == 1:
            model, name = checkpoints.load(paths[0], hp, meta, USE_DTYPE), paths[0]
        else:
            model = checkpoints.average(paths, hp, meta, USE_DTYPE)
            name = os.path.join(os.path.dirname(paths[-1]),
                                f"{os.path.basename(paths[-1])[:-len('.keras')]}_avg{len(paths)}.keras")
    from decoding import one_graph_loops  # Keras has started

    if folder and one_graph_loops(model):  # its loops traced once, by the first process that decodes
        model.graph_folder = os.path.join(folder, "graphs")
    # TensorFlow, Keras and the model are hundreds of thousands of objects that live as long as the
    # process: collected once now and frozen out of the garbage collector's generations, they are
    # not walked again by a full collection, such as tracing a decoding loop set off (docs/speed.md)
    gc.collect()
    gc.freeze()
    return model, sp, name


def chosen_snapshots(hp):
    """The paths of the hp.average_last snapshots of hp.logdir that --average_every asks for: the
    newest, and those every hp.average_every steps before it; a UserError where the run does not
    hold them all (trained without --average_every, not to its end, or with snapshots further apart)."""
    kept = dict(checkpoints.snapshots(hp.logdir))
    last = max(kept, default=0)
    wanted = [last - i * hp.average_every for i in range(hp.average_last)][::-1] if kept else []
    if not kept or any(step not in kept for step in wanted):
        held = ", ".join(map(str, sorted(kept))) or "none"
        raise UserError(f"{os.path.join(hp.logdir, 'ckpt', 'snapshots')}: --average_every {hp.average_every} "
                        f"--average_last {hp.average_last} averages snapshots at steps "
                        f"{', '.join(map(str, wanted)) or '(the last ones)'}, and the run holds {held} (it keeps "
                        f"what its training's --average_every and --average_last said, once its last steps "
                        f"are trained); give settings within them, or --average_every 0 for epoch checkpoints")
    return [kept[step] for step in wanted]


def averaged_count(name):
    """How many checkpoints went into what load_trained named name (1 for a checkpoint alone)."""
    found = re.search(r"_avg(\d+)\.keras$", name)
    return int(found.group(1)) if found else 1


def run_settings(description, argv, add_arguments, show, reads_prepro=False):
    """The command line of a script that uses a trained run (eval.py, translate.py, attention.py,
    page.py, export.py): (hp, args), hp the run's saved settings with the options given over them
    (hyperparams.settings_for_logdir). A --prepro_dir given, or any where the script reads its data
    from it (reads_prepro: eval.py's split), must hold the run's vocabulary."""
    hp, args, overrides = hyperparams.parse_args(description, argv, add_arguments, show=show, from_run=True)
    hp = hyperparams.settings_for_logdir(hp, overrides, args.preset_given)
    if reads_prepro or "prepro_dir" in overrides:
        checkpoints.check_vocabulary(hp.logdir, hp.prepro_dir)
    return hp, args


class Translator:
    """A trained model, loaded once, that translates lists of sentences (translate.py's Python
    face), with its cleaning, splitting of over-long lines and ordering.

    Args:
      logdir: a training run's folder (its hparams.json, vocab/ and ckpt/).
      ckpt: a checkpoint file (default: the run's --average_last newest of <logdir>/ckpt, averaged).
      hp: settings resolved already (translate.py's command line) instead of logdir's.
      preset: the --preset of that command line, if given (for the hint when there is no checkpoint).
      **settings: Hparams fields to override, as on the command line: beam_size and alpha (the
        default decoding; the run's own otherwise), kernels, eval_tokens_per_batch, prepro_dir for a
        run from before <logdir>/vocab existed.
    """

    def __init__(self, logdir=None, ckpt=None, hp=None, preset=None, **settings):
        if hp is None:  # the run's saved settings
            hp = dataclasses.replace(hyperparams.load_hparams(logdir), logdir=logdir, **settings)
        self.hp = hyperparams.validate(hp)
        self.model, self.sp, self.ckpt = load_trained(self.hp, ckpt, preset)

    def translate(self, sentences, beam_size=None, alpha=None, source=None, first_line=1, timings=None):
        """Translations of a list of sentences (a list of str, in order; empty in, empty out), or of
        one sentence (a str). source, first_line: where the sentences come from, for the note on
        stderr about an over-long line that is translated in pieces. timings: a list for each
        batch's (rows, T1, seconds) (trained.lines.translate)."""
        from trained.lines import translate_lines

        if isinstance(sentences, str):
            return self.translate([sentences], beam_size, alpha, source, first_line, timings)[0]
        beam_size = self.hp.beam_size if beam_size is None else beam_size
        if beam_size < 1:
            raise UserError(f"beam_size must be at least 1 (got {beam_size})")
        return translate_lines(self.model, self.sp, [data_load.clean(s) for s in sentences], self.hp.maxlen1,
                               self.hp.eval_tokens_per_batch, beam_size, self.hp.alpha if alpha is None else alpha,
                               source=source, first_line=first_line, beam_stop=self.hp.beam_stop, timings=timings)


def attention_maps(translator, sentence, beam_size=None, alpha=None, encoder=False, decoder_self=False, ids=None):
    """Translate sentence and the attention weights that produced it, decoding as the translator's
    settings say (beam_size, alpha: otherwise).

    The output is decoded first (unless ids, (1, L), gives it: page.py passes beam_trace's, decoded
    already); then the model runs once over it (teacher forcing, what the decoder saw while
    decoding) and its layers return their attention weights (return_attention_scores).

    Returns:
      (source pieces, output pieces (</s> included), translation, maps): maps a list of
      (layer's name, weights (h, Tq, Tk) numpy array, row pieces, column pieces), decoder cross-attention
      of every layer first, then (with encoder) the encoder self-attention of every layer, then (with
      decoder_self) the decoder self-attention of every layer.
    """
    import numpy as np
    from keras import ops

    from decoding import beam_search, greedy_decode

    model, sp = translator.model, translator.sp
    beam_size = translator.hp.beam_size if beam_size is None else beam_size
    alpha = translator.hp.alpha if alpha is None else alpha
    text = data_load.clean(sentence)
    if not text:
        raise UserError("the sentence is empty: give the sentence to translate as the last argument")
    source_ids = sp.encode(text)
    if len(source_ids) + 1 > model.maxlen1:  # past it, learned positions stop and a picture is unreadable
        raise UserError(f"the sentence has {len(source_ids) + 1} tokens (with </s>), more than the maxlen1 "
                        f"{model.maxlen1} the model was trained on: give one shorter sentence (translate.py "
                        f"splits long text)")
    x = data_load.encoder_inputs([source_ids], multiple=1)  # (1, T1): the pieces and </s>
    if ids is None:
        ids = greedy_decode(model, x) if beam_size == 1 else beam_search(model, x, beam_size, alpha,
                                                                         stop=translator.hp.beam_stop)
    out = [int(i) for i in ids[0] if i != data_load.PAD]  # the output pieces, </s> last
    target_in = np.array([[data_load.BOS] + out[:-1]], np.int32)  # (1, T2): what the decoder saw
    memory, source_mask, encoder_weights = model.encode(x, training=False, return_attention_scores=True)
    _, decoder_weights = model.decode(target_in, memory, source_mask, training=False, return_attention_scores=True)
    source_pieces = [sp.id_to_piece(int(i)) for i in x[0]]
    output_pieces = [sp.id_to_piece(i) for i in out]
    maps = [(f"decoder {i + 1} (over the source)", ops.convert_to_numpy(w)[0], output_pieces, source_pieces)
            for i, (_, w) in enumerate(decoder_weights)]
    if encoder:
        maps += [(f"encoder {i + 1} (self)", ops.convert_to_numpy(w)[0], source_pieces, source_pieces)
                 for i, w in enumerate(encoder_weights)]
    if decoder_self:
        read = ["<s>"] + output_pieces[:-1]  # what the decoder read at each step
        maps += [(f"decoder {i + 1} (self)", ops.convert_to_numpy(w)[0], output_pieces, read)
                 for i, (w, _) in enumerate(decoder_weights)]
    translation = data_load.postprocess(sp, ids)[0]
    return source_pieces, output_pieces, translation, maps


def beam_trace(model, sp, source_ids, beam_size, alpha, stop="bound"):
    """Beam search over one sentence one step at a time, keeping every step's hypotheses: the
    search's own functions (decoding.beam_start, beam_step, beam_result) with the decoder run
    uncached over each open prefix, so that each step can be read off.

    Args:
      source_ids: the sentence's piece ids (without </s>).
      stop: when the search ends (decoding.beam_step's stop).

    Returns:
      (tree, finished, hypotheses, ids): tree and finished as support.pictures.draw_beam_tree
      takes them; hypotheses the finished ones, best first, each a dict of text, log_prob,
      penalty, score (log_prob / penalty) and returned (the one the search returns); ids the
      returned hypothesis (its pieces, </s>, then padding).
    """
    import numpy as np
    from keras import ops

    import decoding

    source = data_load.encoder_inputs([source_ids], multiple=1)  # (1, T1): the pieces and </s>
    memory, source_mask = model.encode(source, training=False)  # (1, T1, d_model), mask
    max_len = decoding.default_max_len(model, source.shape[1])  # as the compiled beam search
    state = decoding.beam_start(1, beam_size, max_len)
    steps = []  # per step: the open hypotheses after it (K, t+1), their parents and log-probabilities
    for t in range(max_len):
        prefix = ops.convert_to_numpy(state["alive_seqs"])[0, :, :t]  # (K, t)
        decoder_input = np.concatenate([np.full((beam_size, 1), data_load.BOS), prefix], axis=1)  # (K, t+1)
        logits = model.decode(decoder_input, ops.repeat(memory, beam_size, axis=0),
                              ops.repeat(source_mask, beam_size, axis=0), training=False)[:, -1]  # (K, V')
        state, parents, _ = decoding.beam_step(model, t, ops.cast(logits, "float32"), 0, max_len, beam_size, alpha,
                                               state, stop)
        steps.append((ops.convert_to_numpy(state["alive_seqs"])[0, :, :t + 1], ops.convert_to_numpy(parents)[0],
                      ops.convert_to_numpy(state["alive_scores"])[0]))
        if bool(ops.convert_to_numpy(state["done"])[0]):
            break
    ids, _ = decoding.beam_result(state)
    ids = ops.convert_to_numpy(ids)  # (1, L)
    best = list(ids[0])
    end = best.index(data_load.EOS) if data_load.EOS in best else len(best) - 1
    tree = [[(sp.id_to_piece(int(seqs[k, t])), float(scores[k]), None if t == 0 else int(parents[k]),
              list(seqs[k]) == best[:t + 1]) if scores[k] > decoding.NEG_INF / 2 else (None, 0.0, None, False)
             for k in range(beam_size)] for t, (seqs, parents, scores) in enumerate(steps)]
    finished, hypotheses = [], []
    fin_seqs, fin_scores = ops.convert_to_numpy(state["fin_seqs"])[0], ops.convert_to_numpy(state["fin_scores"])[0]
    for seq, log_p in zip(fin_seqs, fin_scores):  # best first: the search keeps them sorted by score
        if log_p < decoding.NEG_INF / 2:
            continue
        eos_step = list(seq).index(data_load.EOS)  # the step that chose </s>
        parent = None if eos_step == 0 else next(k for k in range(beam_size)
                                                 if list(steps[eos_step - 1][0][k]) == list(seq[:eos_step]))
        penalty = float(ops.convert_to_numpy(decoding.length_penalty(eos_step + 1, alpha)))
        returned = list(seq[:eos_step + 1]) == best[:end + 1]
        finished.append((eos_step, parent, float(log_p), penalty, returned))
        hypotheses.append(dict(text=sp.decode([int(i) for i in seq[:eos_step]]), log_prob=float(log_p), penalty=penalty,
                               score=float(log_p) / penalty, returned=returned))
    return tree, finished, hypotheses, ids
