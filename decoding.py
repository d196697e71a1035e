"""How a trained model writes: lines of text in, translations out, in order.

Sentences are batched by length under a token budget and decoded greedily or by beam search
(the loops are the Transformer's `greedy_decode` and `beam_search`); a line longer than the model
was trained on is cut into pieces that are translated one by one and joined.
"""
import re
import sys

import numpy as np
from tqdm import tqdm

import data_load
from utils import UserError


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
