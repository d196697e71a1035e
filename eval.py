"""Translate the dev or test split with a trained checkpoint and score it with BLEU.

    python eval.py --preset sample
    python eval.py --preset multi30k --split test --ckpt log/multi30k/ckpt/E20L2.10B38.00.keras

Reads the settings saved by training from <logdir>/hparams.json, loads the newest checkpoint of
<logdir>/ckpt, or the mean of the newest --average_last (of snapshots with --average_every; the
run's settings unless given), or --ckpt, translates every sentence whole (as the reference did), writes
<logdir>/results/<split>_<checkpoint>B<sacreBLEU>.txt with source / expected / got for every
sentence and the scores at its end, and <logdir>/results/<split>_<checkpoint>B<reference's BLEU> in
the reference's layout (one translation a line, then the multi-bleu.perl line), and the figures as a
record (support/records.py: BLEU, the training's minutes and precision, date, commit, machine) in
<logdir>/results/<split>_<checkpoint>.json, and prints BLEU
two ways: sacreBLEU (cased, detokenized, 13a, with its signature) and the reference's way
(multi-bleu.perl on cased, whitespace-split text = sacreBLEU with tokenize="none", no smoothing),
and the loss the model trained with over the split's target tokens.
Decoding is the run's --beam_size, --alpha and --beam_stop (its preset's; greedy where the beam is
1): give them to decode otherwise.
"""
import os

import data_load
import hyperparams
from trained.runs import averaged_count, load_trained, run_settings
from support import records
from support.pictures import read_history, wall_seconds
from support.scoring import bleu_scores, format_scores, write_hypotheses, write_results
from support.utils import check_writable, run_cli, section


# The settings eval.py reads (--help shows these): the rest come from <logdir>/hparams.json.
SETTINGS = (*hyperparams.DECODING, "src_lang", "tgt_lang", "eval_tokens_per_batch", "beam_size", "alpha", "beam_stop")


def decoding_name(beam_size, alpha, beam_stop="bound"):
    if beam_size == 1:
        return "greedy"
    return f"beam {beam_size}, alpha {alpha}" + (", ended once K finished" if beam_stop == "finished" else "")


def training_figures(logdir):
    """What the run's history.jsonl (train.py's) says of its training: epochs, minutes, the
    precision it trained in, its peak memory and commit where recorded."""
    path = os.path.join(logdir, "history.jsonl")
    history = read_history(path) if os.path.exists(path) else []
    if not history:
        return {}
    memory = [h["peak_memory_mb"] for h in history if h.get("peak_memory_mb")]
    return dict(epochs=history[-1]["epoch"], train_minutes=round(wall_seconds(history) / 60, 2),
                train_precision=history[-1].get("precision"), train_peak_memory_mb=max(memory) if memory else None,
                train_commit=history[-1].get("commit"))


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--ckpt", metavar="PATH",
                            help="the .keras checkpoint file to evaluate (default: the newest in <logdir>/ckpt)")
        parser.add_argument("--split", default="test", choices=("dev", "test"), help="the split to translate and score")
    # the split's ids are read from its prepro folder: it must hold the run's vocabulary
    hp, args = run_settings(__doc__.split("\n\n")[0], argv, add_arguments, SETTINGS, reads_prepro=True)

    section("Load model")
    model, sp, ckpt = load_trained(hp, args.ckpt, args.preset_given)
    averaged = averaged_count(ckpt)
    print(f"checkpoint {ckpt}" + (f" (the mean of the newest {averaged})" if averaged > 1 else ""))

    check_writable(os.path.join(hp.logdir, "results"))  # before translating, not after
    section(f"Translate the {args.split} split")
    from trained.lines import translate_lines  # loads Keras: after the checks above, which stay quick and quiet
    sources = data_load.load_text(hp.prepro_dir, args.split, hp.src_lang)
    references = data_load.load_text(hp.prepro_dir, args.split, hp.tgt_lang)
    hypotheses = translate_lines(model, sp, sources, hp.maxlen1, hp.eval_tokens_per_batch, hp.beam_size,
                                 hp.alpha, desc=args.split, whole=True, beam_stop=hp.beam_stop,
                                 source=os.path.join(hp.prepro_dir, f"{args.split}.{hp.src_lang}"))

    section("Score")
    import keras  # loaded by now
    import model as transformer

    transformer.compile_for_loss(model, hp)
    pairs = data_load.load_split(hp.prepro_dir, args.split)
    loss = transformer.loss_per_token(model, data_load.loss_batches(*pairs, hp.tokens_per_batch, hp.maxlen1,
                                                                    hp.maxlen2))
    scores = bleu_scores(hypotheses, references, hp.tgt_lang)
    text = format_scores(scores, args.split, extra=", " + decoding_name(hp.beam_size, hp.alpha, hp.beam_stop))
    name = os.path.basename(ckpt)[:-len(".keras")]
    tag = "" if hp.beam_size == 1 else f"_beam{hp.beam_size}a{hp.alpha:g}" + ("f" if hp.beam_stop == "finished" else "")
    path = os.path.join(hp.logdir, "results", f"{args.split}_{name}{tag}B{scores['sacrebleu']:.2f}.txt")
    write_results(path, sources, references, hypotheses, text)
    reference_layout = os.path.join(hp.logdir, "results", f"{args.split}_{name}{tag}B{scores['reference']:.2f}")
    write_hypotheses(reference_layout, hypotheses, scores["reference_report"])
    record = os.path.join(hp.logdir, "results", f"{args.split}_{name}{tag}.json")
    records.write(record, records.make("bleu", dict(
        preset=args.preset_given, logdir=hp.logdir, split=args.split, sentences=len(hypotheses), checkpoint=name,
        averaged=averaged,
        decoding=decoding_name(hp.beam_size, hp.alpha, hp.beam_stop), beam_size=hp.beam_size, alpha=hp.alpha,
        sacrebleu=round(scores["sacrebleu"], 2), reference_bleu=round(scores["reference"], 2), loss=round(loss, 3),
        **training_figures(hp.logdir)), keras.mixed_precision.global_policy().name))
    print(f"wrote {len(hypotheses)} translations to {path} and, in the reference's layout, {reference_layout}")
    print(f"wrote the figures as a record to {record}")
    print(f"loss {args.split} {loss:.3f} (the training loss, label smoothing {hp.smoothing:g}, per target token)")
    print(text)


if __name__ == "__main__":
    run_cli(main)
