"""Translate your own German sentences with a trained model, one per line.

    echo "Ein Mann fährt Fahrrad." | python translate.py --preset sample
    python translate.py --preset multi30k --beam_size 4 --input de.txt --output en.txt

Reads stdin (or --input), writes one English line per input line to stdout (or --output), in
order, with the sentencepiece model and settings saved by training. Empty lines give empty lines.
A sentence longer than the model was trained on (maxlen1 tokens) is split at sentence punctuation
(or between words) and its pieces are translated one by one; a note on stderr says so.
"""
import re
import sys

import hyperparams
from eval import add_decoding_arguments, load_trained, translate
from utils import UserError, atomic_write, run_cli

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
    model, sp, _ = load_trained(hp, args.ckpt, args.preset)

    if args.input:
        try:
            with open(args.input, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            raise UserError(f"{args.input}: file not found") from None
        except UnicodeDecodeError as e:
            raise UserError(f"{args.input}: bytes that are not UTF-8 ({e.reason}); convert it to UTF-8") from None
    else:
        lines = sys.stdin.read().splitlines()

    # every non-empty line becomes one or more pieces of at most maxlen1 - 1 tokens (room for </s>)
    max_tokens = hp.maxlen1 - 1
    pieces, owner = [], []
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        parts = split_long(sp, text, max_tokens)
        if len(parts) > 1:
            print(f"note: {args.input or '<stdin>'}:{lineno}: {len(sp.encode(text))} tokens, longer than "
                  f"maxlen1 {hp.maxlen1}: translated in {len(parts)} pieces", file=sys.stderr)
        pieces += parts
        owner += [lineno - 1] * len(parts)
    outputs = translate(model, sp, pieces, hp.eval_tokens_per_batch, args.beam_size, args.alpha) if pieces else []
    translations = [""] * len(lines)
    for i, text in zip(owner, outputs):
        translations[i] = (translations[i] + " " + text).strip()

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
