"""Lines of text in, translations out, in order: sentences batched by length under a token budget
with a progress bar (`translate`), and lines longer than the model was trained on cut into pieces
that are translated one by one and joined (`translate_lines`, `split_long`). The search itself is
decoding.py's; trained/serving.py has the same cutting in TensorFlow ops for its SavedModel.
"""
import sys
import time

import numpy as np
from tqdm import tqdm

import data_load
from decoding import beam_search, greedy_decode, one_graph_loops
from support.utils import UserError


def batches(model, lens, tokens_per_batch, beam_size):
    """translate's batches of sentences of these lengths (</s> included): data_load.decode_batches
    under the token budget, as the model's decoding loops run (decoding's one_graph_loops).

    Loops compiled for each batch shape (XLA, JAX) get few shapes, lengths padded to multiples of
    data_load.PAD_MULTIPLE, and where a batch keeps its rows to its end (compiled, or eager on
    PyTorch) beam search gets a beam size's share of the budget. As one graph a shape costs nothing
    more: a batch is padded to its own lengths, and beam search's batches hold as many sentences
    as greedy decoding's (finished sentences are set aside as they end, decoding.set_aside): fewer
    steps, each over more rows.
    """
    one_graph = one_graph_loops(model)
    budget = tokens_per_batch if one_graph else max(tokens_per_batch // beam_size, 1)
    return data_load.decode_batches(lens, budget, limit=model.maxlen1,
                                    multiple=1 if one_graph else data_load.PAD_MULTIPLE)


def translate(model, sp, src_seqs, tokens_per_batch, beam_size=1, alpha=0.6, desc="translate", beam_stop="bound",
              timings=None):
    """Translations of source id sequences, in their order: greedy (cached) or beam search (ending
    a sentence as beam_stop says: decoding.beam_step's stop).

    Batches are formed by length (every sentence, however long: `batches`) and put back in
    order. timings: a list to which each batch's (rows, T1, seconds) is appended, in the order
    decoded, its search and its outputs' decoding to text timed (bench/translate_speed.py's shapes).
    """
    lens = [len(s) + 1 for s in src_seqs]
    if model.positional == "learned" and max(lens, default=0) > model.maxlen1:
        i = int(np.argmax(lens))
        raise UserError(f"sentence {i + 1} has {lens[i]} tokens but a model with learned positions takes "
                        f"at most maxlen1 {model.maxlen1}: shorten or split it")
    out = [None] * len(src_seqs)
    todo = batches(model, lens, tokens_per_batch, beam_size)
    for idx, length in tqdm(todo, desc=desc, unit="batch", leave=False, disable=None):
        start = time.perf_counter()
        x = data_load.encoder_inputs([src_seqs[i] for i in idx], length=length)  # (N, T1)
        ids = greedy_decode(model, x) if beam_size == 1 else beam_search(model, x, beam_size, alpha, stop=beam_stop)
        for i, text in zip(idx, data_load.postprocess(sp, ids)):
            out[i] = text
        if timings is not None:
            timings.append((len(idx), length, time.perf_counter() - start))
    return out


SENTENCE_END = ".!?;:"  # a sentence ends at a word that ends in one of these
WORD_START = "\u2581"  # sentencepiece's mark of a word's first piece


def split_long(sp, text, max_tokens):
    """Token ids of text, in pieces of at most max_tokens: whole sentences packed greedily, a
    sentence too long for a piece word by word, a word too long for one (rare) cut anywhere.

    It works on the token ids, which are the words' own one after another (sentencepiece encodes
    each word alone): a word starts at a piece that starts with the mark ▁, a sentence at a word
    after one that ends in . ! ? ; or :. trained/serving.py's split_long_tensor is the same rule in
    TensorFlow ops.
    """
    ids = sp.encode(text)
    if len(ids) <= max_tokens:
        return [ids]
    pieces = [sp.id_to_piece(i) for i in ids]
    words = [i for i, piece in enumerate(pieces) if i == 0 or piece.startswith(WORD_START)]
    sentences = [i for i in words if i == 0 or pieces[i - 1].endswith(tuple(SENTENCE_END))] + [len(ids)]
    units = []  # (start, end) of each sentence, or of each word of a sentence too long
    for start, end in zip(sentences, sentences[1:]):
        inner = [start, end] if end - start <= max_tokens else [w for w in words if start <= w < end] + [end]
        units += zip(inner, inner[1:])
    out, current = [], []
    for start, end in units:
        unit = ids[start:end]
        if current and len(current) + len(unit) <= max_tokens:
            current = current + unit
            continue
        if current:
            out.append(current)
        current = unit if len(unit) <= max_tokens else []
        if not current:
            out += [unit[i:i + max_tokens] for i in range(0, len(unit), max_tokens)]
    return out + ([current] if current else [])


def translate_lines(model, sp, lines, maxlen1, tokens_per_batch, beam_size=1, alpha=0.6, desc="translate",
                    source=None, whole=False, first_line=1, beam_stop="bound", timings=None):
    """Translations of text lines, one per line, in order.

    Empty lines give empty lines. A line longer than maxlen1 - 1 tokens (room for </s>) is cut by
    split_long and its pieces are translated one by one and joined; with whole (evaluation, as the
    reference) it is translated whole, unless the model's learned positions stop at maxlen1. With
    `source` (a name for messages) a note on stderr says where a line was cut. Batches are formed
    by tokens, so memory stays bounded. first_line: the number of lines[0] in those messages.
    timings: as translate's.
    """
    limit = maxlen1 - 1 if not whole or model.positional == "learned" else None
    pieces, owner = [], []
    for lineno, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        parts = [sp.encode(line.strip())] if limit is None else split_long(sp, line.strip(), limit)
        if len(parts) > 1 and source:
            print(f"note: {source}:{lineno}: {sum(map(len, parts))} tokens, longer than maxlen1 {maxlen1}: "
                  f"translated in {len(parts)} pieces", file=sys.stderr)
        pieces += parts
        owner += [lineno - first_line] * len(parts)
    outputs = (translate(model, sp, pieces, tokens_per_batch, beam_size, alpha, desc, beam_stop, timings)
               if pieces else [])
    translations = [""] * len(lines)
    for i, text in zip(owner, outputs):
        translations[i] = (translations[i] + " " + text).strip()
    return translations
