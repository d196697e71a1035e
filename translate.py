"""Translate your own sentences with a trained model, one per line.

    echo "Ein Mann fährt Fahrrad." | python translate.py --preset sample
    python translate.py --preset multi30k --beam_size 4 --input de.txt --output en.txt

From Python (a notebook): load once, translate many times (trained/runs.py; `from translate import
Translator` works too).

    from trained.runs import Translator
    translator = Translator("log/multi30k")
    translator.translate(["Ein Hund läuft.", "Zwei Kinder spielen."], beam_size=4)

Reads stdin (or --input), writes one target-language line per input line to stdout (or --output), in
order, with the sentencepiece model and settings saved by training (in the log directory: no prepro
folder needed). From stdin, each line is translated and printed as soon as it arrives (a terminal,
a pipe that stays open), the model loaded once. Empty lines give empty lines.
A sentence longer than the model was trained on (maxlen1 tokens) is split at sentence punctuation
(or between words) and its pieces are translated one by one; a note on stderr says so.
"""
import itertools
import os
import sys

import hyperparams
from trained.runs import Translator, run_settings  # noqa: F401  (also `from translate import Translator`, as before)
from support.utils import UserError, atomic_write, run_cli


# The settings translate.py uses (--help shows these): the rest come from <logdir>/hparams.json.
SETTINGS = (*hyperparams.DECODING, "eval_tokens_per_batch", "beam_size", "alpha", "beam_stop")


def decode_lines(data, name, first_line=1):
    """The lines of UTF-8 bytes, split on newlines only (the Translator cleans each, as prepro.py
    cleans the corpus); a UserError naming the line of bytes that are not UTF-8. first_line: the
    line number of data's first line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data[:e.start].count(b"\n")
        raise UserError(f"{name}:{line}: bytes that are not UTF-8 ({e.reason}); convert it to UTF-8 "
                        f"(e.g. iconv -t UTF-8)") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def input_chunks(path=None):
    """Lists of input lines: a file's all at once; stdin's as they arrive, the complete
    lines of each read (a line typed in a terminal, a pipe's buffer), so that translations follow
    the input instead of waiting for its end."""
    if path:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise UserError(f"{path}: file not found") from None
        yield decode_lines(data, path)
        return
    fd, pending, line = sys.stdin.fileno(), b"", 1
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        pending += data
        cut = pending.rfind(b"\n") + 1
        if cut:
            lines = decode_lines(pending[:cut], "<stdin>", line)
            pending, line = pending[cut:], line + len(lines)
            yield lines
    if pending:
        yield decode_lines(pending, "<stdin>", line)


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--ckpt", metavar="PATH",
                            help="the .keras checkpoint file to translate with (default: the newest in "
                                 "<logdir>/ckpt, or the mean of the newest --average_last)")
        parser.add_argument("--input", metavar="PATH",
                            help="file of sentences to translate, one per line (default: stdin)")
        parser.add_argument("--output", metavar="PATH",
                            help="file for the translations (default: stdout); its folder must exist")
    hp, args = run_settings(__doc__.split("\n\n")[0], argv, add_arguments, SETTINGS)
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UserError(f"{args.output}: its folder {os.path.dirname(os.path.abspath(args.output))} does not "
                        f"exist; create it first")
    chunks = input_chunks(args.input)
    first = next(chunks, [])  # bad input at the start fails before the model is loaded
    translator = Translator(ckpt=args.ckpt, hp=hp, preset=args.preset_given)

    def translate_all(out):
        line = 1
        for lines in itertools.chain([first], chunks):
            translations = translator.translate(lines, source=args.input or "<stdin>", first_line=line)
            out.write("".join(t + "\n" for t in translations))
            out.flush()
            line += len(lines)

    if args.output:
        with atomic_write(args.output) as tmp:  # the file appears once complete
            with open(tmp, "w", encoding="utf-8") as f:
                translate_all(f)
    else:
        translate_all(sys.stdout)


if __name__ == "__main__":
    run_cli(main)
