"""Translate your own German sentences with a trained model, one per line.

    echo "Ein Mann fährt Fahrrad." | python translate.py --preset sample
    python translate.py --preset multi30k --beam_size 4 --input de.txt --output en.txt

Reads stdin (or --input), writes one English line per input line to stdout (or --output), in
order, with the sentencepiece model and settings saved by training. Empty lines give empty lines.
A sentence longer than the model was trained on (maxlen1 tokens) is split at sentence punctuation
(or between words) and its pieces are translated one by one; a note on stderr says so.
"""
import sys

import hyperparams
from eval import add_decoding_arguments, load_trained
from prepro import clean
from utils import UserError, atomic_write, run_cli


def read_input(path=None):
    """Lines of a UTF-8 file (or stdin), split on newlines only and cleaned as prepro.py cleans."""
    name = path or "<stdin>"
    try:
        if path:
            with open(path, "rb") as f:
                data = f.read()
        else:
            data = sys.stdin.buffer.read()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{name}:{line}: bytes that are not UTF-8 ({e.reason}); convert it to UTF-8 "
                        f"(e.g. iconv -t UTF-8)") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [clean(line) for line in lines]


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--ckpt", help="checkpoint (default: newest in <logdir>/ckpt)")
        parser.add_argument("--input", help="file of German sentences, one per line (default: stdin)")
        parser.add_argument("--output", help="file for the translations (default: stdout)")
        add_decoding_arguments(parser)
    hp, args, overrides = hyperparams.parse_args(__doc__.split("\n\n")[0], argv, add_arguments)
    hp = hyperparams.settings_for_logdir(hp, overrides)
    if args.beam_size < 1:
        raise UserError(f"--beam_size must be at least 1 (got {args.beam_size})")
    lines = read_input(args.input)  # bad input fails before the model is loaded
    model, sp, _ = load_trained(hp, args.ckpt, args.preset)
    from decoding import translate_lines  # loads Keras: after the checks above, which stay quick and quiet
    translations = translate_lines(model, sp, lines, hp.maxlen1, hp.eval_tokens_per_batch, args.beam_size,
                                   args.alpha, source=args.input or "<stdin>")
    text = "".join(t + "\n" for t in translations)
    if args.output:
        with atomic_write(args.output) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


if __name__ == "__main__":
    run_cli(main)
