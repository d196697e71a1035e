"""Hyperparameters: one dataclass, five presets, and `--name value` overrides for every field.

Names follow the reference (Kyubyong/transformer `hparams.py`): d_model, d_ff, num_blocks,
num_heads, dropout_rate, maxlen1 (source), maxlen2 (target), vocab_size, lr, warmup_steps,
num_epochs, smoothing, logdir. Training writes the resolved settings to `<logdir>/hparams.json`;
eval.py and translate.py read them back from there, so a checkpoint travels with its settings.

Each field is declared once, with its description, its group, its choices (if a closed set), and
whether it shapes the model (a checkpoint loads only into a model with the same value) or may
change when a run resumes: --help, validate, MODEL_FIELDS and RESUMABLE_FIELDS derive from it.
"""
import argparse
import dataclasses
import json
import os
import sys

from support.utils import UserError, atomic_write

CORPUS_FORMATS = ("parallel", "iwslt")
SWITCHES = ("auto", "on", "off")
PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
STRATEGIES = ("auto", "one", "mirrored", "multi_worker", "data_parallel")
POSITIONAL = ("sinusoid", "learned", "none")
NORMS = ("post", "pre")
LR_DECAYS = ("rsqrt", "linear")
OUTPUT_VOCABS = ("target", "all")
EMBEDDING_INITS = ("normal", "xavier")
PAD_LOGITS = ("learned", "zero")
KERNELS = ("auto", "plain", "fast")


GROUPS = {  # the option groups of --help, and the scripts that show each
    "data": "where the corpus and prepro.py's output are, and what prepro.py builds",
    "model": "the Transformer's shape and the choices that set it apart from the reference",
    "training": "batches, optimizer, schedule and loss",
    "devices": "precision, compilation, kernels and data parallelism",
    "evaluation": "decoding after each epoch and in eval.py / translate.py",
    "run": "the log directory and its checkpoints",
}


def setting(default, group, help, choices=None, model=False, resumable=False):
    """An Hparams field with its --help line, its group, the values it may take (None: any of its
    type), whether it shapes the model's weights or outputs (`model`: a checkpoint loads only into
    a model with the same value) and whether a resumed run may change it (`resumable`)."""
    return dataclasses.field(default=default, metadata={"group": group, "help": help, "choices": choices,
                                                        "model": model, "resumable": resumable})


@dataclasses.dataclass
class Hparams:
    corpus: str = setting("parallel", "data", "parallel: line-aligned files <prefix>.<lang>[.gz]; iwslt: the "
                                              "IWSLT 2016/2017 release as distributed",
                          choices=CORPUS_FORMATS)
    data_dir: str = setting("corpora/sample", "data", "where the raw corpus lies",
                            resumable=True)
    prepro_dir: str = setting("prepro/sample", "data", "where prepro.py writes the vocabulary and id files",
                              resumable=True)
    train_prefix: str = setting("train", "data", "file name prefix of the training split (parallel corpora)")
    dev_prefix: str = setting("dev", "data", "file name prefix of the dev split (parallel corpora)")
    test_prefix: str = setting("test", "data", "file name prefix of the test split (parallel corpora)")
    src_lang: str = setting("de", "data", "source language: the file suffix")
    tgt_lang: str = setting("en", "data", "target language: the file suffix")
    vocab_size: int = setting(400, "data", "pieces of the joint sentencepiece BPE vocabulary (ids 0-3: "
                                           "<pad> <unk> <s> </s>)")

    d_model: int = setting(64, "model", "width of every layer, d_model (paper: 512)",
                           model=True)
    d_ff: int = setting(256, "model", "inner width of the feed-forward network (paper: 2048)",
                        model=True)
    num_blocks: int = setting(2, "model", "encoder and decoder blocks, each (paper: 6)",
                              model=True)
    num_heads: int = setting(4, "model", "attention heads; d_model must be divisible by it (paper: 8)",
                             model=True)
    dropout_rate: float = setting(0.1, "model", "dropout on embeddings, attention weights (unless "
                                                "--attention_dropout) and (with --residual_dropout) sublayer outputs")
    attention_dropout: float = setting(-1.0, "model", "dropout on the attention weights alone; -1: the same as "
                                                      "--dropout_rate")
    maxlen1: int = setting(50, "model", "longest source in tokens (with </s>) kept for training",
                           model=True)
    maxlen2: int = setting(50, "model", "longest target in tokens (with </s>) kept for training",
                           model=True)
    positional: str = setting("sinusoid", "model", "sinusoid (paper, reference 2019), learned (reference legacy) "
                                                   "or none (no position information: what order is worth)",
                              choices=POSITIONAL, model=True)
    output_vocab: str = setting("target", "model", "target: the softmax covers the ids 0-3 and the pieces of "
                                                   "the training targets; all: the whole vocabulary (the reference)",
                                choices=OUTPUT_VOCABS, model=True)
    attention_output: bool = setting(True, "model", "the output projection W^O of multi-head attention (paper "
                                                    "3.2.2; the reference 2019 has none)",
                                     model=True)
    residual_dropout: bool = setting(True, "model", "dropout on each sublayer's output before the residual sum "
                                                    "(paper 5.4; the reference 2019 has none)")
    layer_norm_epsilon: float = setting(1e-6, "model", "layer normalization's epsilon (the reference: 1e-8)",
                                        model=True)
    embedding_init: str = setting("normal", "model", "normal: N(0, d_model^-0.5); xavier: Glorot uniform "
                                                     "(the reference)",
                                  choices=EMBEDDING_INITS)
    pad_logit: str = setting("learned", "model", "learned: the <pad> row gives a trained logit; zero: that "
                                                 "row is zero in the output projection too (the reference)",
                             choices=PAD_LOGITS, model=True)
    norm: str = setting("post", "model", "post: LayerNorm(x + sublayer(x)) (paper 3.1, reference); pre: "
                                         "x + sublayer(LayerNorm(x)), and a layer norm at the end of each stack",
                        choices=NORMS, model=True)
    scale_embeddings: bool = setting(True, "model", "multiply the embeddings by sqrt(d_model) (paper 3.4, "
                                                    "reference)",
                                     model=True)
    share_embeddings: bool = setting(True, "model", "one matrix for the source and target embeddings and the "
                                                    "output projection (paper 3.4, reference 2019); off: three "
                                                    "(the reference's legacy code)",
                                     model=True)

    tokens_per_batch: int = setting(1024, "training", "token budget of a batch: sentences x padded length of "
                                                      "the longer side")
    subword_sampling: float = setting(0.0, "training", "BPE-dropout: every epoch re-segments the training text, "
                                                       "each merge skipped with this probability (0: off); it "
                                                       "slows learning on a small corpus: on the sample, 30 epochs "
                                                       "reach dev BLEU 12 instead of 55 (37 instead of 96 with "
                                                       "--batch_sentences 16)")
    batch_sentences: int = setting(0, "training", "> 0: batches of this many random sentences padded to the "
                                                  "longest (the reference: 128) instead of token budgets")
    precision: str = setting("auto", "devices", "float32, mixed_bfloat16, mixed_float16, or auto: "
                                                "mixed_bfloat16 where the GPU or CPU has bfloat16 units",
                             choices=PRECISIONS, resumable=True)
    jit_compile: str = setting("auto", "devices", "XLA for training steps and TensorFlow's decoding loops "
                                                  "(off: one graph for every batch shape): on, off, or auto "
                                                  "(on for GPUs and JAX, off for TensorFlow on a CPU)",
                               choices=SWITCHES, resumable=True)
    kernels: str = setting("auto", "devices", "plain: modules.py as written; fast: kernels/fast.py's kernels; auto: "
                                              "those measured faster on this backend",
                           choices=KERNELS, resumable=True)
    strategy: str = setting("auto", "devices", "data parallelism: auto, one, mirrored, multi_worker "
                                               "(TensorFlow) or data_parallel (JAX)",
                            choices=STRATEGIES, resumable=True)
    length_multiple: int = setting(0, "devices", "pad batch lengths to a multiple of this; 0: 1 on TensorFlow "
                                                 "without XLA, 8 where shapes are compiled and --length_buckets "
                                                 "is off",
                                   resumable=True)
    length_buckets: int = setting(0, "devices", "pad every training batch to one of at most this many shapes, "
                                                "the lengths chosen from the data to pad least; 0: 16 where "
                                                "steps are compiled (unless --length_multiple is given), else off",
                                  resumable=True)
    compile_cache: str = setting("auto", "devices", "where compiled programs (JAX's; TensorFlow's decoding loops, "
                                                    "compiled by XLA or traced as one graph) are kept for the next "
                                                    "run (delete it to free the space): a folder, off, or auto: "
                                                    "compile_cache beside --logdir",
                                 resumable=True)
    adam_beta2: float = setting(0.98, "training", "Adam's beta2 (paper: 0.98; the reference: 0.999)",
                                resumable=True)
    adam_epsilon: float = setting(1e-9, "training", "Adam's epsilon (paper: 1e-9; the reference: 1e-8)",
                                  resumable=True)
    lr: float = setting(1e-3, "training", "peak learning rate, reached after --warmup_steps",
                        resumable=True)
    warmup_steps: int = setting(100, "training", "steps of linear warmup",
                                resumable=True)
    lr_decay: str = setting("rsqrt", "training", "after warmup: rsqrt (paper, reference) or linear (to 0 at "
                                                 "the end of --num_epochs, which a resumed run then keeps)",
                            choices=LR_DECAYS)
    num_epochs: int = setting(30, "training", "epochs to train (a resumed run may raise it, unless its "
                                              "--lr_decay is linear)",
                              resumable=True)
    smoothing: float = setting(0.1, "training", "label smoothing epsilon",
                               resumable=True)
    weight_decay: float = setting(0.0, "training", "decoupled weight decay (AdamW): each step every weight shrinks "
                                                   "by weight_decay x learning rate; 0: none (paper, reference)",
                                  resumable=True)
    seed: int = setting(1234, "training", "seed of weights, batches, dropout and the BPE vocabulary")
    logdir: str = setting("log/sample", "run", "the run's folder: settings, vocabulary, checkpoints, logs",
                          resumable=True)
    eval_sentences: int = setting(0, "evaluation", "dev sentences translated for BLEU after each epoch; 0: all",
                                  resumable=True)
    eval_tokens_per_batch: int = setting(4096, "evaluation", "token budget of a decoding batch",
                                         resumable=True)
    beam_size: int = setting(1, "evaluation", "hypotheses kept by beam search in eval.py, translate.py and "
                                              "attention.py; 1: greedy (the BLEU after each epoch is greedy)",
                             resumable=True)
    alpha: float = setting(0.6, "evaluation", "beam search length penalty exponent: a hypothesis' log "
                                              "probability is divided by ((5 + length) / 6) ** alpha",
                           resumable=True)
    beam_stop: str = setting("bound", "evaluation", "when beam search ends a sentence: bound (once no open "
                                                    "hypothesis can still beat the best finished one, so the best "
                                                    "score is certain) or finished (once beam_size hypotheses have "
                                                    "ended, as CTranslate2 and fairseq: fewer steps)",
                             choices=("bound", "finished"), resumable=True)
    average_last: int = setting(1, "evaluation", "the weights eval.py, translate.py, attention.py and export.py "
                                                 "load: the mean of the newest this many epoch checkpoints (paper "
                                                 "6.1: five), or snapshots with --average_every; 1: the last "
                                                 "epoch's; --ckpt: that file alone",
                                resumable=True)
    average_every: int = setting(0, "evaluation", "average snapshots of the weights taken every this many steps "
                                                  "instead of epoch checkpoints: training keeps the last "
                                                  "--average_last of them, the newest at its last step, in "
                                                  "<logdir>/ckpt/snapshots (0: epoch checkpoints)",
                                 resumable=True)
    keep_checkpoints: int = setting(5, "run", "epoch checkpoints kept in <logdir>/ckpt",
                                    resumable=True)
    save_every_steps: int = setting(300, "run", "also checkpoint mid-epoch every this many steps (0: only "
                                                "per epoch)",
                                    resumable=True)
    keep_step_checkpoints: int = setting(2, "run", "mid-epoch checkpoints kept in <logdir>/ckpt/steps",
                                         resumable=True)
    skip_nonfinite: bool = setting(False, "training", "leave out batches with a NaN/Inf loss instead of stopping",
                                   resumable=True)


# The reference's 2019 values (Kyubyong/transformer: hparams.py, model.py, modules.py, data_load.py),
# as Hparams fields.
REFERENCE_2019 = dict(
    vocab_size=32000, d_model=512, d_ff=2048, num_blocks=6, num_heads=8, dropout_rate=0.3,
    maxlen1=100, maxlen2=100, positional="sinusoid", output_vocab="all", attention_output=False,
    residual_dropout=False, layer_norm_epsilon=1e-8, embedding_init="xavier", pad_logit="zero",
    batch_sentences=128, tokens_per_batch=4096, lr=3e-4, warmup_steps=4000, lr_decay="rsqrt",
    num_epochs=20, smoothing=0.1, adam_beta2=0.999, adam_epsilon=1e-8,
)

PRESETS = {
    # Tiny: the built-in demo and the tests, on corpora/sample, a few minutes on a 2-core CPU.
    "sample": {},
    # A small model that trains well on a 2-core CPU (Multi30k task 1, 29k pairs). Its batch budget,
    # attention dropout, weight decay and decoding were chosen on val (docs/archive/results-to-2026-12-05.md,
    # "Levers for the multi30k preset"); its training too, 12 epochs at a rate of 2e-3 falling
    # linearly to 0 (docs/recipes.md, the recipe linear_12: the dev BLEU of the 20 epochs with the
    # last five averaged it replaced, in about 0.6 of their time); and its beam search's stopping rule,
    # CTranslate2's (docs/results.md, "How the presets were chosen": as good on dev, fewer steps).
    "multi30k": dict(
        data_dir="data/multi30k",
        prepro_dir="prepro/multi30k",
        dev_prefix="val",
        test_prefix="test_2016_flickr",
        vocab_size=8000,
        d_model=256,
        d_ff=1024,
        num_blocks=3,
        num_heads=4,
        dropout_rate=0.1,
        attention_dropout=0.0,
        maxlen1=100,
        maxlen2=100,
        tokens_per_batch=1024,
        lr=2e-3,
        warmup_steps=600,
        lr_decay="linear",
        weight_decay=0.3,
        num_epochs=12,
        logdir="log/multi30k",
        eval_sentences=0,
        beam_size=4,
        alpha=1.4,
        beam_stop="finished",
    ),
    # The reference's 2019 experiment at a 2-core CPU's size: the multi30k preset's data and model size,
    # and every other value of the iwslt2016 preset below (the reference's training as it was: its
    # learning rate, warmup, dropout, epochs, batches and the details of its code), for comparing
    # the port with the reference's own code on the same data (docs/ablations.md).
    "multi30k_reference": dict(REFERENCE_2019, data_dir="data/multi30k", prepro_dir="prepro/multi30k",
                               dev_prefix="val", test_prefix="test_2016_flickr", vocab_size=8000, d_model=256,
                               d_ff=1024, num_blocks=3, num_heads=4, logdir="log/multi30k_reference",
                               eval_sentences=0, precision="float32"),
    # The reference's 2019 experiment on IWSLT 2016 de-en: its hparams.py values and what its code
    # does without a setting (Adam's defaults, Xavier embeddings, the zero <pad> row in the output
    # projection, no W^O, dropout on embeddings and attention weights only, 128-sentence batches,
    # label smoothing over the whole vocabulary, float32); tests/test_hyperparams.py lists each with its source.
    "iwslt2016": dict(REFERENCE_2019, corpus="iwslt", data_dir="data/iwslt2016", prepro_dir="prepro/iwslt2016",
                      logdir="log/iwslt2016", eval_sentences=0, precision="float32"),
    # The same task and model size with every improvement of this port turned on: token-budget
    # batches, residual dropout and W^O (paper 3.2.2, 5.4), the paper's Adam constants, the smaller
    # softmax. README, "IWSLT 2016 on a GPU".
    "iwslt2016_improved": dict(REFERENCE_2019, corpus="iwslt", data_dir="data/iwslt2016",
                               prepro_dir="prepro/iwslt2016", logdir="log/iwslt2016_improved",
                               eval_sentences=0, batch_sentences=0, tokens_per_batch=4096,
                               attention_output=True, residual_dropout=True, layer_norm_epsilon=1e-6,
                               embedding_init="normal", pad_logit="learned", output_vocab="target",
                               adam_beta2=0.98, adam_epsilon=1e-9),
}

# Fields that fix the shape of the weights or what the model outputs: a checkpoint only loads into a
# model with the same ones.
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(Hparams) if f.metadata["model"])
# The settings of every script that decodes a trained run (eval, translate, attention, export): where
# the run and its data are, the model's shape (given, it must match the checkpoint's), the kernels
# and compilation to decode with and the checkpoints to average; the rest are the run's (hparams.json), and
# training's are refused.
DECODING = ("prepro_dir", "logdir", *MODEL_FIELDS, "kernels", "jit_compile", "average_last",
            "average_every")
# Fields a resumed run may change: they change neither the model (rebuilt from the checkpoint, with
# its dropout), nor the batches of an epoch (a resumed epoch continues at its batch), nor what a
# checkpoint means. train.py records each change with its step in hparams.json. The optimizer's
# settings are among them (lowering --lr is the cure for a diverged run); a moved prepro_dir must
# still hold the run's data (checkpoints.check_same_data). Every other field is fixed once a run
# has a checkpoint.
RESUMABLE_FIELDS = tuple(f.name for f in dataclasses.fields(Hparams) if f.metadata["resumable"])
# What a field added after a run was saved meant before it existed (load_hparams).
SAVED_BEFORE = {"output_vocab": "all"}


def field_names():
    return [f.name for f in dataclasses.fields(Hparams)]


def changed(had, wanted):
    """The settings two runs differ in, {field: (had's value, wanted's)}, in field order: each
    side an Hparams or a dict of its fields (as hparams.json or a ledger keeps them); a field
    one side lacks counts as None there."""
    had, wanted = ({f: getattr(h, f) for f in field_names()} if isinstance(h, Hparams) else h
                   for h in (had, wanted))
    names = field_names() + sorted((set(had) | set(wanted)) - set(field_names()))
    return {f: (had.get(f), wanted.get(f)) for f in names if had.get(f) != wanted.get(f)}


def preset(name, **changes):
    """The Hparams of preset `name`, with the settings in changes instead of its own, as
    `--<name> value` on a command line would set them: preset("sample", norm="pre")."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    unknown = sorted(set(changes) - set(field_names()))
    if unknown:
        raise UserError(f"no setting {', '.join(unknown)}: the settings are those `python hyperparams.py --help` "
                        f"lists")
    hp = Hparams(**{**PRESETS[name], **changes})
    return validate(hp) if changes else hp


def validate(hp):
    """Raise UserError for settings that cannot work."""
    problems = []
    for f in dataclasses.fields(Hparams):
        choices = f.metadata["choices"]
        if choices is not None and getattr(hp, f.name) not in choices:
            problems.append(f"--{f.name} {getattr(hp, f.name)!r} is not one of {', '.join(choices)}")
    if hp.length_multiple < 0:
        problems.append(f"--length_multiple must be 0 (automatic) or positive (got {hp.length_multiple})")
    if hp.length_buckets < 0:
        problems.append(f"--length_buckets must be 0 (automatic) or positive (got {hp.length_buckets})")
    for name in ("d_model", "d_ff", "num_blocks", "num_heads", "maxlen1", "maxlen2", "vocab_size",
                 "tokens_per_batch", "num_epochs", "eval_tokens_per_batch", "beam_size", "keep_checkpoints",
                 "keep_step_checkpoints", "average_last"):
        if getattr(hp, name) < 1:
            problems.append(f"--{name} must be at least 1 (got {getattr(hp, name)})")
    if hp.num_heads >= 1 and hp.d_model % hp.num_heads:
        problems.append(f"d_model {hp.d_model} is not divisible by num_heads {hp.num_heads}: "
                        f"pick num_heads among the divisors of d_model")
    if hp.d_model % 2:
        problems.append(f"d_model {hp.d_model} must be even for the sinusoid positional encoding")
    if hp.tokens_per_batch < max(hp.maxlen1, hp.maxlen2):
        problems.append(f"tokens_per_batch {hp.tokens_per_batch} is smaller than the longest sentence "
                        f"kept (maxlen1 {hp.maxlen1}, maxlen2 {hp.maxlen2}): raise it or lower maxlen")
    if not 0.0 <= hp.dropout_rate < 1.0:
        problems.append(f"dropout_rate must be in [0, 1) (got {hp.dropout_rate})")
    if not (hp.attention_dropout == -1.0 or 0.0 <= hp.attention_dropout < 1.0):
        problems.append(f"attention_dropout must be -1 (as dropout_rate) or in [0, 1) (got {hp.attention_dropout})")
    if hp.average_every < 0:
        problems.append(f"--average_every must be 0 (epoch checkpoints) or positive (got {hp.average_every})")
    if hp.average_last > hp.keep_checkpoints and not hp.average_every:
        problems.append(f"average_last {hp.average_last} averages more epoch checkpoints than the run keeps "
                        f"(keep_checkpoints {hp.keep_checkpoints}): lower it, or train with more kept")
    if hp.alpha < 0:
        problems.append(f"alpha must be 0 (no length penalty) or positive (got {hp.alpha})")
    if hp.weight_decay < 0:
        problems.append(f"weight_decay must be 0 (off) or positive (got {hp.weight_decay})")
    if not 0.0 <= hp.smoothing < 1.0:
        problems.append(f"smoothing must be in [0, 1) (got {hp.smoothing})")
    if hp.batch_sentences < 0:
        problems.append(f"--batch_sentences must be 0 (token budgets) or positive (got {hp.batch_sentences})")
    if not 0.0 <= hp.subword_sampling < 1.0:
        problems.append(f"subword_sampling must be in [0, 1) (got {hp.subword_sampling})")
    if not 0.0 < hp.adam_beta2 < 1.0 or hp.adam_epsilon <= 0 or hp.layer_norm_epsilon <= 0:
        problems.append("adam_beta2 must be in (0, 1), adam_epsilon and layer_norm_epsilon positive")
    if hp.save_every_steps < 0:
        problems.append(f"--save_every_steps must be 0 (off) or positive (got {hp.save_every_steps})")
    if hp.lr <= 0 or hp.warmup_steps < 0:
        problems.append("lr must be positive and warmup_steps non-negative")
    if hp.vocab_size < 8:
        problems.append(f"vocab_size {hp.vocab_size} is too small: it needs room beyond ids 0-3")
    if problems:
        raise UserError("settings that cannot work: " + "; ".join(problems))
    return hp


def parse_bool(text):
    """argparse type for true/false options: 1/0, true/false, yes/no."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a truth value: use 1 or 0")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, except where there is none to show or its help says it."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser(description, preset_name="sample", show=None, from_run=False):
    """An ArgumentParser with --preset and one --<field> option per Hparams field that the script
    uses: show names settings groups (GROUPS) and single fields; None: all of them.

    Field options default to argparse.SUPPRESS, so the parsed namespace holds only what was given;
    their help shows the preset's value, or with from_run (a script that works with a trained run's
    saved settings) says the default is the run's.
    """
    defaults = preset(preset_name)
    epilog = (f"Settings not given are the run's, those it was trained with (<logdir>/hparams.json); "
              f"--preset picks the run's --logdir ({defaults.logdir} here).") if from_run else None
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter, epilog=epilog)
    parser.add_argument("--preset", default=preset_name, choices=sorted(PRESETS),
                        help="the run of this preset (its --logdir)" if from_run else
                        "settings to start from (values shown below: this preset's); --<name> value "
                        "overrides any of them")
    add_field_options(parser, defaults, shown_fields(show), from_run=from_run)
    return parser


def shown_fields(show):
    """The Hparams fields that `show` (groups and single fields) names; None: all of them."""
    if show is None:
        return None
    return [f.name for f in dataclasses.fields(Hparams) if f.name in show or f.metadata["group"] in show]


def add_field_options(parser, defaults, names=None, accept_others=True, from_run=False):
    """One --<field> option per Hparams field, in one argparse group per settings group, described
    by the field's help and its value in defaults. Fields outside names (if given) are parsed but
    not shown in --help, so that parse_args can refuse them with a one-line reason; with
    accept_others=False they are not added at all.

    They default to argparse.SUPPRESS, so that given_fields() finds only what was given. With
    from_run, their help says the default is the trained run's (but --logdir's: the preset's).
    """
    for group, description in GROUPS.items():
        fields = [f for f in dataclasses.fields(Hparams) if f.metadata["group"] == group]
        shown = [f for f in fields if names is None or f.name in names]
        options = parser.add_argument_group(f"{group} settings", description) if shown else parser
        for f in fields if accept_others else shown:
            value = getattr(defaults, f.name)
            kind = parse_bool if isinstance(value, bool) else type(value)
            text = f"{f.metadata['help']} (preset: {int(value) if isinstance(value, bool) else value})"
            if from_run and f.name != "logdir":
                text = f"{f.metadata['help']} (default: the run's)"
            options.add_argument(f"--{f.name}", type=kind, default=argparse.SUPPRESS,
                                 metavar=type(value).__name__.upper().replace("BOOL", "0|1"),
                                 help=text if f in shown else argparse.SUPPRESS)


def given_fields(args, names=None):
    """{field: value} for the Hparams fields (or those in names) present in an argparse namespace."""
    return {name: getattr(args, name) for name in (names or field_names()) if hasattr(args, name)}


def parse_args(description, argv=None, add_arguments=None, show=None, from_run=False, unread=None):
    """Parse `--preset P --name value ...`.

    Args:
      description: the script's --help text.
      argv: arguments (default sys.argv[1:]).
      add_arguments: optional callable(parser) adding the script's own options.
      show: the settings the script uses (build_parser); None: all. A setting outside them is
        refused with one line (UserError) rather than accepted and ignored.
      from_run: the script works with a trained run's saved settings (--help says so).
      unread: what that one line tells the user to do instead (default: a word on --help).

    Returns:
      (hp, args, overrides): resolved and validated Hparams, the argparse namespace (its
      preset_given: the --preset given, or None), and the dict of fields given on the command line.
    """
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default="sample")
    known, _ = pre.parse_known_args(argv)
    preset_name = known.preset if known.preset in PRESETS else "sample"
    parser = build_parser(description, preset_name, show, from_run)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    args.preset_given = args.preset if any(a == "--preset" or a.startswith("--preset=") for a in argv) else None
    overrides = given_fields(args)
    read = shown_fields(show)
    ignored = [f"--{name}" for name in overrides if read is not None and name not in read]
    if ignored:
        script = os.path.basename(parser.prog)
        default = ("it decodes with the run's saved settings, so training's do not apply" if from_run
                   else f"{script} --help lists the settings it reads")
        raise UserError(f"{', '.join(ignored)}: not read by {script}; {unread or default}")
    hp = dataclasses.replace(preset(args.preset), **overrides)
    return validate(hp), args, overrides


def save_hparams(hp, logdir, changes=()):
    """Write hp as JSON to <logdir>/hparams.json (atomically), with `changes`: the record of
    settings changed on resuming, [{"step": s, field: [before, after], ...}, ...]."""
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, "hparams.json")
    record = dataclasses.asdict(hp)
    if changes:
        record["changes"] = list(changes)
    with atomic_write(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.write("\n")
    return path


def saved_changes(logdir):
    """The record of settings changed on resuming, from <logdir>/hparams.json ([] if none)."""
    with open(os.path.join(logdir, "hparams.json"), encoding="utf-8") as f:
        return json.load(f).get("changes", [])


def train_first(logdir, preset=None):
    """The command that trains a run into logdir: with the --preset given (None: not given, so the
    user names the one to train)."""
    return f"python train.py --preset {preset or '<the preset to train>'} --logdir {logdir}"


def load_hparams(logdir, preset=None):
    """Read <logdir>/hparams.json written by training; preset: the --preset given, for the hint."""
    path = os.path.join(logdir, "hparams.json")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no saved settings; train first ({train_first(logdir, preset)}) "
                        f"or pass the --logdir of a finished training run")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}); restore it or train again") from None
    saved.pop("changes", None)  # the record of settings changed on resuming (save_hparams)
    unknown = sorted(set(saved) - set(field_names()))
    if unknown:
        raise UserError(f"{path}: unknown settings {', '.join(unknown)}; was it written by another version?")
    # The run is where its hparams.json is: a folder that was moved or copied, or saved with a path
    # relative to another working directory, is found where it was read.
    saved["logdir"] = logdir
    return Hparams(**as_saved(saved))


def as_saved(saved):
    """A saved run's settings (hparams.json's, a ledger's) with every field added since, as it was
    before the field existed (SAVED_BEFORE, else its default)."""
    return {**dataclasses.asdict(Hparams()), **SAVED_BEFORE, **saved}


def settings_for_logdir(hp, overrides, preset=None):
    """The settings of the training run in hp.logdir, with the command line's overrides on top;
    preset: the --preset given, if one was (for the hint when there is no run)."""
    saved = load_hparams(hp.logdir, preset)
    return validate(dataclasses.replace(saved, **overrides))


if __name__ == "__main__":
    # `python hyperparams.py --preset P --name value ...` prints the settings a run would use;
    # --help lists every setting with its description.
    print(json.dumps(dataclasses.asdict(parse_args("Print the settings of a preset with overrides, as JSON.")[0]),
                     indent=2, sort_keys=True))
