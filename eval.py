"""Translate the dev or test split with a trained checkpoint and score it with BLEU.

    python eval.py --preset sample
    python eval.py --preset multi30k --split test --ckpt log/multi30k/ckpt/E20L2.10B38.00.keras

Reads the settings saved by training from <logdir>/hparams.json, loads the newest checkpoint of
<logdir>/ckpt (or --ckpt), writes <logdir>/results/<split>_<checkpoint>B<bleu>.txt with source /
expected / got for every sentence and the scores at its end, and prints BLEU two ways:
sacreBLEU (cased, detokenized, 13a, with its signature) and the reference's way (multi-bleu.perl on
cased, whitespace-split text = sacreBLEU with tokenize="none"). Decoding is greedy, or beam search
with --beam_size K and length penalty --alpha.
"""
import os
import re
import sys

import numpy as np
from tqdm import tqdm

import data_load
import hyperparams
from utils import UserError, atomic_write, run_cli, section

CHECKPOINT = re.compile(r"^E(\d+)L([\d.]+|nan|inf)B([\d.]+)\.keras$")


def bleu_scores(hypotheses, references):
    """Corpus BLEU of detokenized hypotheses against one reference each.

    Returns:
      dict: sacrebleu (13a, cased) score and signature; reference (tokenize none, as the
      reference's multi-bleu.perl on raw text) score and signature.
    """
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    out = {}
    for key, tokenize in (("sacrebleu", "13a"), ("reference", "none")):
        metric = BLEU(tokenize=tokenize)
        out[key] = metric.corpus_score(hypotheses, [references]).score
        out[key + "_signature"] = str(metric.get_signature())
    return out


def read_hypotheses(path):
    """One translation per line; a trailing `BLEU = ...` line (the reference's result files) is dropped."""
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().splitlines() if not line.startswith("BLEU = ")]


def format_scores(scores, split, extra=""):
    """The two BLEU lines eval.py ends with."""
    return (f"BLEU {split} sacreBLEU = {scores['sacrebleu']:.2f} ({scores['sacrebleu_signature']}){extra}\n"
            f"BLEU {split} reference's way (multi-bleu, whitespace tokens) = {scores['reference']:.2f} "
            f"({scores['reference_signature']}){extra}")


def checkpoints(logdir):
    """Epoch checkpoints of <logdir>/ckpt as a list of (epoch, path), oldest first."""
    ckpt_dir = os.path.join(logdir, "ckpt")
    if not os.path.isdir(ckpt_dir):
        return []
    found = []
    for name in os.listdir(ckpt_dir):
        m = CHECKPOINT.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(ckpt_dir, name)))
    return sorted(found)


def load_checkpoint(path, hp):
    """Load a .keras checkpoint written by train.py; a UserError if it is missing or does not fit."""
    import keras

    import model as _model  # noqa: F401  (registers the model's classes for deserialization)

    if not os.path.isfile(path):
        raise UserError(f"{path}: checkpoint not found")
    try:
        m = keras.models.load_model(path, compile=False)
    except Exception as e:  # Keras raises many types for a damaged or foreign file
        raise UserError(f"{path}: cannot load this checkpoint ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        f"is it a complete .keras file written by train.py?") from None
    wanted = {f: getattr(hp, f) for f in hyperparams.MODEL_FIELDS}
    got = {f: getattr(m, f) for f in hyperparams.MODEL_FIELDS}
    if wanted != got:
        diff = ", ".join(f"{f} {got[f]} (settings say {wanted[f]})" for f in wanted if wanted[f] != got[f])
        raise UserError(f"{path}: checkpoint of a different model: {diff}; use the --logdir it was "
                        f"trained in, or drop the overrides")
    return m


def load_trained(hp, ckpt=None, preset="sample", average_last=1):
    """The model of a checkpoint (default: the newest of hp.logdir) and its vocabulary.

    With average_last N > 1, the weights are the mean of the newest N epoch checkpoints.

    Returns:
      (model, sentencepiece processor, name of what was loaded).
    """
    found = checkpoints(hp.logdir)
    if ckpt is None and not found:
        raise UserError(f"{os.path.join(hp.logdir, 'ckpt')}: no checkpoint; train first "
                        f"(python train.py --preset {preset}) or pass --ckpt")
    if average_last > 1:
        if ckpt is not None:
            raise UserError("--average_last averages the newest checkpoints of --logdir: drop --ckpt")
        if len(found) < average_last:
            raise UserError(f"--average_last {average_last}: only {len(found)} checkpoints in "
                            f"{os.path.join(hp.logdir, 'ckpt')} (keep more with --keep_checkpoints)")
        paths = [p for _, p in found[-average_last:]]
        model = load_checkpoint(paths[-1], hp)
        total = [np.zeros_like(w, dtype=np.float64) for w in model.get_weights()]
        for path in paths:
            for acc, w in zip(total, load_checkpoint(path, hp).get_weights()):
                acc += w
        model.set_weights([(acc / len(paths)).astype(w.dtype) for acc, w in zip(total, model.get_weights())])
        name = f"{os.path.basename(paths[-1])[:-len('.keras')]}_avg{average_last}.keras"
        return model, data_load.load_vocab(hp.prepro_dir), os.path.join(os.path.dirname(paths[-1]), name)
    ckpt = found[-1][1] if ckpt is None else ckpt
    return load_checkpoint(ckpt, hp), data_load.load_vocab(hp.prepro_dir), ckpt


def translate(model, sp, src_seqs, tokens_per_batch, beam_size=1, alpha=0.6, desc="translate"):
    """Translations of source id sequences, in their order: greedy (cached) or beam search.

    Batches are formed by length (every sentence, however long) and put back in order; beam
    search divides the token budget by the beam size.
    """
    lens = [len(s) + 1 for s in src_seqs]
    if model.positional == "learned" and max(lens, default=0) > model.maxlen1:
        i = int(np.argmax(lens))
        raise UserError(f"sentence {i + 1} has {lens[i]} tokens but a model with learned positions takes "
                        f"at most maxlen1 {model.maxlen1}: shorten or split it")
    out = [None] * len(src_seqs)
    batches = data_load.eval_batches(lens, max(tokens_per_batch // beam_size, 1), sort=True)
    for idx in tqdm(batches, desc=desc, unit="batch", leave=False):
        x = data_load.encoder_inputs([src_seqs[i] for i in idx])
        ids = model.greedy_decode(x) if beam_size == 1 else model.beam_search(x, beam_size, alpha)
        for i, text in zip(idx, data_load.postprocess(sp, ids)):
            out[i] = text
    return out


SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def split_long(sp, text, max_tokens):
    """Token ids of text, in pieces of at most max_tokens: cut at sentence ends, else between
    words, else (a single very long word) anywhere."""
    ids = sp.encode(text)
    if len(ids) <= max_tokens:
        return [ids]
    units = []
    for sentence in SENTENCE_END.split(text):
        units += [sentence] if len(sp.encode(sentence)) <= max_tokens else sentence.split()
    pieces, current = [], ""
    for unit in units:
        candidate = f"{current} {unit}".strip()
        if len(sp.encode(candidate)) <= max_tokens:
            current = candidate
            continue
        if current:
            pieces.append(sp.encode(current))
        unit_ids = sp.encode(unit)
        if len(unit_ids) <= max_tokens:
            current = unit
        else:
            pieces += [unit_ids[i:i + max_tokens] for i in range(0, len(unit_ids), max_tokens)]
            current = ""
    if current:
        pieces.append(sp.encode(current))
    return pieces



def translate_lines(model, sp, lines, maxlen1, tokens_per_batch, beam_size=1, alpha=0.6, desc="translate",
                    source=None):
    """Translations of text lines, one per line, in order.

    Empty lines give empty lines. A line longer than maxlen1 - 1 tokens (room for </s>) is cut by
    split_long and its pieces are translated one by one and joined; with `source` (a name for
    messages) a note on stderr says so. Batches are formed by tokens, so memory stays bounded.
    """
    pieces, owner = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = split_long(sp, line.strip(), maxlen1 - 1)
        if len(parts) > 1 and source:
            print(f"note: {source}:{lineno}: {sum(map(len, parts))} tokens, longer than maxlen1 {maxlen1}: "
                  f"translated in {len(parts)} pieces", file=sys.stderr)
        pieces += parts
        owner += [lineno - 1] * len(parts)
    outputs = translate(model, sp, pieces, tokens_per_batch, beam_size, alpha, desc) if pieces else []
    translations = [""] * len(lines)
    for i, text in zip(owner, outputs):
        translations[i] = (translations[i] + " " + text).strip()
    return translations


def add_decoding_arguments(parser):
    parser.add_argument("--beam_size", type=int, default=1, help="1: greedy decoding")
    parser.add_argument("--alpha", type=float, default=0.6,
                        help="beam search length penalty exponent, ((5 + length) / 6) ** alpha")


def decoding_name(beam_size, alpha):
    return "greedy" if beam_size == 1 else f"beam {beam_size}, alpha {alpha}"


def write_results(path, sources, references, hypotheses, score_text):
    """Results file: source / expected / got for every sentence, then the scores."""
    with atomic_write(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for s, r, h in zip(sources, references, hypotheses):
                f.write(f"- source: {s}\n- expected: {r}\n- got: {h}\n\n")
            f.write(score_text + "\n")


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--ckpt", help="checkpoint to evaluate (default: newest in <logdir>/ckpt)")
        parser.add_argument("--split", default="test", choices=("dev", "test"))
        parser.add_argument("--average_last", type=int, default=1,
                            help="average the weights of the newest N epoch checkpoints")
        add_decoding_arguments(parser)
    hp, args, overrides = hyperparams.parse_args(__doc__.split("\n\n")[0], argv, add_arguments)
    hp = hyperparams.settings_for_logdir(hp, overrides)

    section("Load model")
    model, sp, ckpt = load_trained(hp, args.ckpt, args.preset, args.average_last)
    print(f"checkpoint {ckpt}" + (f" (mean of the newest {args.average_last})" if args.average_last > 1 else ""))

    section(f"Translate the {args.split} split")
    sources = data_load.load_text(hp.prepro_dir, args.split, hp.src_lang)
    references = data_load.load_text(hp.prepro_dir, args.split, hp.tgt_lang)
    if args.beam_size < 1:
        raise UserError(f"--beam_size must be at least 1 (got {args.beam_size})")
    hypotheses = translate_lines(model, sp, sources, hp.maxlen1, hp.eval_tokens_per_batch, args.beam_size,
                                 args.alpha, desc=args.split,
                                 source=os.path.join(hp.prepro_dir, f"{args.split}.{hp.src_lang}"))

    section("Score")
    scores = bleu_scores(hypotheses, references)
    text = format_scores(scores, args.split, extra=", " + decoding_name(args.beam_size, args.alpha))
    name = os.path.basename(ckpt)[:-len(".keras")]
    tag = "" if args.beam_size == 1 else f"_beam{args.beam_size}a{args.alpha:g}"
    path = os.path.join(hp.logdir, "results", f"{args.split}_{name}{tag}B{scores['sacrebleu']:.2f}.txt")
    write_results(path, sources, references, hypotheses, text)
    print(f"wrote {len(hypotheses)} translations to {path}")
    print(text)


if __name__ == "__main__":
    run_cli(main)
