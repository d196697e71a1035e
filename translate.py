"""Translate your own sentences with a trained model, one per line.

    echo "Ein Mann fährt Fahrrad." | python translate.py --preset sample
    python translate.py --preset multi30k --beam_size 4 --input de.txt --output en.txt

From Python (a notebook): load once, translate many times.

    from translate import Translator
    translator = Translator("log/multi30k")
    translator.translate(["Ein Hund läuft.", "Zwei Kinder spielen."], beam_size=4)

Reads stdin (or --input), writes one target-language line per input line to stdout (or --output), in
order, with the sentencepiece model and settings saved by training (in the log directory: no prepro
folder needed). From stdin, each line is translated and printed as soon as it arrives (a terminal,
a pipe that stays open), the model loaded once. Empty lines give empty lines.
A sentence longer than the model was trained on (maxlen1 tokens) is split at sentence punctuation
(or between words) and its pieces are translated one by one; a note on stderr says so.
"""
import dataclasses
import itertools
import os
import sys

import hyperparams
from eval import load_trained
from prepro import clean
from utils import UserError, atomic_write, run_cli


# The settings translate.py uses (--help shows these): the rest come from <logdir>/hparams.json.
SETTINGS = ("prepro_dir", "model", "devices", "eval_tokens_per_batch", "beam_size", "alpha", "logdir")


def decode_lines(data, name, first_line=1):
    """Cleaned lines of UTF-8 bytes (split on newlines only, as prepro.py cleans them); a UserError
    naming the line of bytes that are not UTF-8. first_line: the line number of data's first line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data[:e.start].count(b"\n")
        raise UserError(f"{name}:{line}: bytes that are not UTF-8 ({e.reason}); convert it to UTF-8 "
                        f"(e.g. iconv -t UTF-8)") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [clean(line) for line in lines]


def input_chunks(path=None):
    """Lists of cleaned input lines: a file's all at once; stdin's as they arrive, the complete
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


class Translator:
    """A trained model, loaded once, that translates lists of sentences: the Python face of this
    script, with its cleaning, splitting of over-long lines and ordering.

    Args:
      logdir: a training run's folder (its hparams.json, vocab/ and ckpt/).
      ckpt: a checkpoint file (default: the newest of <logdir>/ckpt).
      hp: settings resolved already (translate.py's command line) instead of logdir's.
      **settings: Hparams fields to override, as on the command line: beam_size and alpha (the
        default decoding; the run's own otherwise), kernels, eval_tokens_per_batch, prepro_dir for a
        run from before <logdir>/vocab existed.
    """

    def __init__(self, logdir=None, ckpt=None, hp=None, **settings):
        if hp is None:  # the run's saved settings
            hp = dataclasses.replace(hyperparams.load_hparams(logdir), logdir=logdir, **settings)
        self.hp = hyperparams.validate(hp)
        self.model, self.sp, self.ckpt = load_trained(self.hp, ckpt)

    def translate(self, sentences, beam_size=None, alpha=None, source=None, first_line=1):
        """Translations of a list of sentences (a list of str, in order; empty in, empty out), or of
        one sentence (a str). source, first_line: where the sentences come from, for the note on
        stderr about an over-long line that is translated in pieces."""
        from decoding import translate_lines

        if isinstance(sentences, str):
            return self.translate([sentences], beam_size, alpha, source, first_line)[0]
        beam_size = self.hp.beam_size if beam_size is None else beam_size
        if beam_size < 1:
            raise UserError(f"beam_size must be at least 1 (got {beam_size})")
        return translate_lines(self.model, self.sp, [clean(s) for s in sentences], self.hp.maxlen1,
                               self.hp.eval_tokens_per_batch, beam_size, self.hp.alpha if alpha is None else alpha,
                               source=source, first_line=first_line)


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--ckpt", metavar="PATH", help="checkpoint (default: newest in <logdir>/ckpt)")
        parser.add_argument("--input", metavar="PATH", help="file of sentences to translate, one per line (default: stdin)")
        parser.add_argument("--output", metavar="PATH",
                            help="file for the translations (default: stdout); its folder must exist")
    hp, args, overrides = hyperparams.parse_args(__doc__.split("\n\n")[0], argv, add_arguments,
                                                 show=SETTINGS)
    hp = hyperparams.settings_for_logdir(hp, overrides)
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise UserError(f"{args.output}: its folder {os.path.dirname(os.path.abspath(args.output))} does not "
                        f"exist; create it first")
    chunks = input_chunks(args.input)
    first = next(chunks, [])  # bad input at the start fails before the model is loaded
    translator = Translator(ckpt=args.ckpt, hp=hp)

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
