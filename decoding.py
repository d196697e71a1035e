"""How a trained model writes: the search, from source ids to output ids.

In the order a reader meets them: the reference's greedy decoding, which re-runs the whole decoder
over the prefix for every new token (`uncached_greedy_step`); greedy decoding with the model's
cached step, one position per step (`greedy_loop`, over Transformer.start_cache and decode_step);
batched beam search with the GNMT length penalty, the caches reordered with one gather per step
(`beam_loop` with `ReorderedCache`), or kept in place (`InPlaceBeamCache`, the kernels' choice).
Run as one graph, a loop sets finished sentences aside as they end (`set_aside`).
`greedy_decode` and `beam_search` run them compiled (`compiled`). The model owns every pass through
its layers; this file only chooses tokens. Lines of text in and out: trained/lines.py.

Shapes: N sentences (n: those a loop still decodes), T1 source length, K beam size, L the most
output tokens (the cache length), V' the logits columns, h heads, d_k d_model / h.
"""
import functools
import warnings

import keras
import numpy as np
from keras import ops

from data_load import BOS, EOS, PAD, PAD_MULTIPLE
from modules import NEG_INF


def default_max_len(model, source_length):
    """Most output tokens for a source of this (padded) length: 1.5 * T1 + 10, T1 counted as loops
    compiled for each shape pad it (up to a multiple of PAD_MULTIPLE, not past maxlen1 when it fits:
    data_load.padded_length), so that a batch padded to its own lengths (as one graph) decodes as
    long, and beam search stops where it would; and no more than a learned position table holds.
    source_length: a Python int, or an int scalar tensor in a traced graph (trained/serving.py's
    SavedModel), which gets one back."""
    up = -(-source_length // PAD_MULTIPLE) * PAD_MULTIPLE  # T1 rounded up to a multiple
    if isinstance(source_length, int):
        padded = min(up, model.maxlen1) if source_length <= model.maxlen1 else up
    else:
        padded = ops.where(source_length <= model.maxlen1, ops.minimum(up, model.maxlen1), up)
    max_len = 3 * padded // 2 + 10  # 1.5 * T1 rounded down, + 10
    if model.positional != "learned":
        return max_len
    return min(max_len, model.maxlen2) if isinstance(max_len, int) else ops.minimum(max_len, model.maxlen2)


BARRED = 3  # the most columns a step may bar: <pad>, <s> and </s>


def bar_tokens(values, columns, allow_eos):
    """values (...) of the logits columns `columns` (...), with those of <pad> and <s> set to -inf,
    and </s> too unless allow_eos (a boolean scalar). No target holds <pad> or <s>, and a chosen
    <pad> would read as padding to the uncached decoder and to the output; columns 0-3 are ids 0-3
    whatever the output vocabulary."""
    never = ops.logical_or(ops.equal(columns, PAD), ops.equal(columns, BOS))  # (...)
    barred = ops.logical_or(never, ops.logical_and(ops.equal(columns, EOS), ops.logical_not(allow_eos)))
    return ops.where(barred, -np.inf, values)  # (...)


def best_log_probs(logits, width, allow_eos):
    """Each row's `width` best logits columns, and BARRED more in case barred ones are among them,
    best first (ties: the earlier column first), with their log-probabilities, barred ones at -inf
    (bar_tokens): (..., W) each, W = width + BARRED or every column if fewer.

    A log-probability is z - logsumexp(z) over every column (the model's softmax, barred columns
    included), taken here at the chosen columns alone: the step never writes the log-softmax of
    the whole vocabulary, only reads the logits (float32, (..., V')) to sum their exponentials."""
    top, columns = ops.top_k(logits, min(width + BARRED, logits.shape[-1]))  # (..., W) each
    peak = top[..., :1]  # (..., 1) each row's largest logit
    total = ops.log(ops.sum(ops.exp(logits - peak), axis=-1, keepdims=True)) + peak  # (..., 1) logsumexp
    return bar_tokens(top - total, columns, allow_eos), ops.cast(columns, "int32")  # (..., W) each


def greedy_choice(model, logits, allow_eos):
    """The most likely next token (N,) and its log-probability (N,); never <pad> or <s>, and
    never </s> unless allowed.
    logits (N, V') float32 over the logits columns (columns 0-3 are ids 0-3 either way)."""
    log_probs, columns = best_log_probs(logits, 1, allow_eos)  # (N, W) each, best first
    pick = ops.expand_dims(ops.cast(ops.argmax(log_probs, axis=-1), "int32"), 1)  # (N, 1) the best not barred
    best = ops.take_along_axis(columns, pick, axis=1)[:, 0]  # (N,) columns
    return model.to_ids(best), ops.max(log_probs, axis=-1)


# 1. The reference's way: the whole decoder over the prefix, for every new token

def uncached_greedy_step(model, target_in, memory, source_mask, allow_eos):
    """The reference's step: the whole decoder over the prefix (N, t), logits for every position,
    the last one used -> (next ids (N,), their log-probabilities (N,))."""
    with warnings.catch_warnings():  # the first step attends over one key: a softmax over an axis of size 1
        warnings.filterwarnings("ignore", message="You are using a softmax over axis")
        logits = model.decode(target_in, memory, source_mask, training=False)[:, -1]  # (N, V)
    return greedy_choice(model, ops.cast(logits, "float32"), allow_eos)


# 2. Cached: one new position a step, the earlier keys and values kept (the model's decode_step)

def greedy_loop(model, source, max_len, min_len, shrink=False):
    """Cached greedy decoding as one loop in the graph (`ops.while_loop`): encode, then one
    token per step until every sentence has produced </s> or max_len tokens.

    Args:
      source: (N, T1) ids.
      max_len: L, an int, or an int scalar tensor in a traced graph (`one_graph`; trained/serving.py's
        SavedModel). It fixes the output and cache shapes.
      min_len: int scalar tensor: </s> is barred before this many tokens.
      shrink: set finished sentences aside as they end (`set_aside`; one graph only).

    Returns:
      ids (N, L) with <pad> after </s>, and log-probabilities (N,).
    """
    context, caches = model.start_cache(source, max_len)
    output_matrix = model.output_matrix()  # (V', d), the same at every step
    n = ops.shape(source)[0]

    def cond(t, live, aside):
        return ops.logical_and(t < max_len, ops.logical_not(ops.all(live["finished"])))

    def body(t, live, aside):
        logits, caches = model.decode_step(live["tokens"], t, live["context"], live["caches"],
                                           output_matrix=output_matrix)  # (n, V')
        next_ids, chosen = greedy_choice(model, logits, t >= min_len)  # (n,), (n,)
        next_ids = ops.where(live["finished"], PAD, next_ids)  # (n,)
        live = dict(live, tokens=next_ids, caches=caches,
                    finished=ops.logical_or(live["finished"], ops.equal(next_ids, EOS)),
                    scores=live["scores"] + ops.where(live["finished"], 0.0, chosen),  # (n,)
                    ids=model.parts.slice_update(live["ids"], (0, t), ops.expand_dims(next_ids, 1)))  # (n, L)
        if shrink:
            (live,), aside = set_aside(live["finished"], [(live, 1)], aside, lambda: (live["ids"], live["scores"]))
        return t + 1, live, aside

    live = dict(tokens=ops.full((n,), BOS, "int32"), finished=ops.zeros((n,), "bool"),
                ids=ops.zeros((n, max_len), "int32"), scores=ops.zeros((n,), "float32"),
                context=context, caches=caches)
    aside = nothing_aside(n, max_len) if shrink else ()
    _, live, aside = ops.while_loop(cond, body, (ops.convert_to_tensor(0, "int32"), live, aside))
    return put_back(aside, (live["ids"], live["scores"])) if shrink else (live["ids"], live["scores"])


# 3. Beam search: the K best hypotheses of every sentence, extended together

def gather_beams(x, beams):
    """x (N, K', ...) -> the rows `beams` (N, J) of each sentence: (N, J, ...). One gather of rows
    n * K' + beams[n] of x with its first two axes as one (ops.take_along_axis, on TensorFlow,
    broadcasts and transposes around its gather)."""
    n, k = ops.shape(x)[0], ops.shape(x)[1]
    rows = ops.expand_dims(ops.arange(n, dtype=beams.dtype) * k, 1) + beams  # (N, J)
    return ops.take(ops.reshape(x, (-1, *ops.shape(x)[2:])), rows, axis=0)  # (N, J, ...)


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, section 7)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def beam_step(model, t, logits, min_len, max_len, beam_size, alpha, state, stop="bound"):
    """Choose among the K x V' extensions of every sentence's open hypotheses (one beam step).

    Of the 2K best candidates, those among the best K that end in </s> compete, by
    log-probability over the length penalty, for the K finished slots; the best K others stay
    open. A sentence is done once the best score an open hypothesis could still reach (its
    log-probability over the penalty at max_len: log-probabilities only fall) cannot beat its best
    finished one; with stop "finished", also once K hypotheses have ended (CTranslate2's and
    fairseq's rule: fewer steps, and the best score is no longer certain).

    Args:
      logits: (N*G, V') float32 next-token logits of each sentence's first G hypotheses: all K, or
        at a first step only the one open hypothesis (G = 1: the others are at NEG_INF).
      state: dict of alive_seqs (N, K, L), alive_scores (N, K), fin_seqs (N, K, L), fin_norm
        (N, K) finished scores over the penalty, fin_scores (N, K), fin_count (N,) hypotheses ended
        so far, done (N,).
      stop: "bound" or "finished" (Python str): when a sentence is done, as above.

    Returns:
      (the new state, parents (N, K): the hypothesis each open one extends, tokens (N*K,)).
    """
    n, vocab = ops.shape(state["alive_scores"])[0], model.output_size
    # 1. extend: the 2K best of K x V' candidates per sentence: each open hypothesis's 2K best
    # columns by their own log-probabilities, and W - 2K more that may be barred (in exact order: a
    # hypothesis's score added to them, large beside their differences, could round two apart into
    # a tie), then the best 2K of those K x W by score; ties go to the first, so beam 1 chooses as
    # greedy decoding does. A hypothesis's 2K best stay among its W, so the choice is the same.
    logits = ops.reshape(logits, (n, -1, vocab))  # (N, G, V')
    own, columns = best_log_probs(logits, 2 * beam_size, t >= min_len)  # (N, G, W) each
    scores = state["alive_scores"][:, :ops.shape(own)[1]]  # (N, G)
    candidates = ops.reshape(own + ops.expand_dims(scores, -1), (n, -1))  # (N, G*W)
    top_scores, top = ops.top_k(candidates, 2 * beam_size)  # (N, 2K)
    top = ops.cast(top, "int32")  # (N, 2K) candidate = beam * W + rank
    columns = gather_beams(ops.reshape(columns, (n, -1)), top)  # (N, 2K)
    top_beams, top_tokens = top // ops.shape(own)[-1], model.to_ids(columns)  # (N, 2K)
    top_seqs = model.parts.slice_update(gather_beams(state["alive_seqs"], top_beams), (0, 0, t),
                                        ops.expand_dims(top_tokens, -1))  # (N, 2K, L)
    is_eos = ops.equal(top_tokens, EOS)  # (N, 2K)
    # 2. finished: </s> among the best K candidates of a sentence not yet done
    eligible = ops.logical_and(is_eos, ops.arange(2 * beam_size) < beam_size)  # (N, 2K)
    eligible = ops.logical_and(eligible, ops.logical_not(ops.expand_dims(state["done"], 1)))
    new_norm = ops.where(eligible, top_scores / length_penalty(t + 1, alpha), NEG_INF)  # (N, 2K)
    fin_norm, keep = ops.top_k(ops.concatenate([state["fin_norm"], new_norm], axis=1), beam_size)  # (N, K)
    fin_seqs = gather_beams(ops.concatenate([state["fin_seqs"], top_seqs], axis=1), keep)  # (N, K, L)
    fin_scores = gather_beams(ops.concatenate([state["fin_scores"], top_scores], axis=1), keep)  # (N, K)
    fin_count = state["fin_count"] + ops.sum(ops.cast(eligible, "int32"), axis=1)  # (N,)
    # 3. open: the best K candidates that do not end in </s>
    open_scores, pick = ops.top_k(ops.where(is_eos, NEG_INF, top_scores), beam_size)  # (N, K)
    parents = gather_beams(top_beams, pick)  # (N, K)
    tokens = ops.reshape(gather_beams(top_tokens, pick), (-1,))  # (N*K,)
    # 4. done: no open hypothesis can beat the best finished one
    bound = ops.max(open_scores, axis=1) / length_penalty(max_len, alpha)  # (N,)
    done = ops.logical_or(state["done"], ops.logical_and(fin_norm[:, 0] > NEG_INF / 2, bound <= fin_norm[:, 0]))
    if stop == "finished":
        done = ops.logical_or(done, fin_count >= beam_size)
    state = dict(alive_seqs=gather_beams(top_seqs, pick), fin_seqs=fin_seqs, fin_norm=fin_norm,
                 fin_scores=fin_scores, fin_count=fin_count, done=done,
                 alive_scores=ops.where(ops.expand_dims(done, 1), NEG_INF, open_scores))
    return state, parents, tokens


def beam_start(n, beam_size, max_len):
    """The beam state before the first step: K copies of the empty hypothesis, of which one is open
    (the others at NEG_INF, so the first step does not pick the same extension K times)."""
    first = ops.concatenate([ops.zeros((n, 1)), ops.full((n, beam_size - 1), NEG_INF)], axis=1)  # (N, K)
    return dict(alive_seqs=ops.zeros((n, beam_size, max_len), "int32"), alive_scores=first,
                fin_seqs=ops.zeros((n, beam_size, max_len), "int32"), fin_norm=ops.full((n, beam_size), NEG_INF),
                fin_scores=ops.full((n, beam_size), NEG_INF), fin_count=ops.zeros((n,), "int32"),
                done=ops.zeros((n,), "bool"))


def beam_result(state):
    """Each sentence's best finished hypothesis, or its best open one if none finished within
    max_len: ids (N, L) and log-probability (N,)."""
    has_finished = ops.expand_dims(state["fin_norm"][:, 0] > NEG_INF / 2, 1)  # (N, 1)
    best_open = ops.expand_dims(ops.cast(ops.argmax(state["alive_scores"], axis=1), "int32"), 1)  # (N, 1)
    ids = ops.where(has_finished, state["fin_seqs"][:, 0],
                    gather_beams(state["alive_seqs"], best_open)[:, 0])  # (N, L)
    scores = ops.where(has_finished[:, 0], state["fin_scores"][:, 0],
                       gather_beams(state["alive_scores"], best_open)[:, 0])  # (N,)
    return ids, scores


class ReorderedCache:
    """Beam search's caches, a row per hypothesis: the model's start_cache with the encoder output's
    keys/values repeated K times. After each step the rows are reordered with one gather, so that
    row j holds the history of the hypothesis now in slot j.

    `initial` is the loop's cache state, (context, caches); `step(tokens, t, state)` gives the
    next-token logits (N*G, V') of the hypotheses tokens (N*G,) extend and the new
    state; `reorder(state, parents)` follows parents (N, K). `rows_per_sentence`: the rows of the
    state's tensors a sentence has (K here); `first_group`: G at the first step (K here: every
    row has its own cache from the start).
    """

    def __init__(self, model, source, max_len, beam_size, shapes_change=False):
        self.model, self.beam_size, self.rows_per_sentence = model, beam_size, beam_size
        self.first_group = beam_size
        self.initial = model.start_cache(source, max_len, repeat=beam_size)
        self.output_matrix = model.output_matrix()  # (V', d), the same at every step

    def step(self, tokens, t, state):
        context, caches = state
        logits, caches = self.model.decode_step(tokens, t, context, caches,
                                                output_matrix=self.output_matrix)  # (N*K, V')
        return logits, (context, caches)

    def reorder(self, state, parents):
        context, caches = state
        first_row = ops.expand_dims(ops.arange(ops.shape(parents)[0], dtype="int32") * self.beam_size, 1)  # (N, 1)
        rows = ops.reshape(first_row + parents, (-1,))  # (N*K,) the row each hypothesis came from
        return context, [tuple(ops.take(c, rows, axis=0) for c in cache) for cache in caches]  # (N*K, h, L, d_k) each


class InPlaceBeamCache:
    """Beam search's caches without reordering (--kernels' beam_cache): the K hypotheses of a
    sentence share one cache, entry p * K + k holding the key/value written at step p by the
    hypothesis then in slot k. Rows never move; each hypothesis carries the mask of its ancestors'
    entries (`history`, reordered instead of the caches), and the encoder output's keys/values are
    kept once per sentence, not K times. Each step runs the model's decode_step with the K hypotheses of a
    sentence as K queries of one row. Methods as ReorderedCache's; the state is (context, history,
    caches), a row per sentence.

    At the first step the K hypotheses are one, the empty one (the others wait at NEG_INF). Where
    the loop's shapes may change (shapes_change: one graph) and its V' columns fill the 2K candidates
    a step keeps, that step computes it alone, one query a sentence writing one entry (first_group
    1); else K, writing K entries, as every later step. Step t >= 1 writes entries
    first_group + (t - 1) * K + k."""

    def __init__(self, model, source, max_len, beam_size, shapes_change=False):
        self.model, self.beam_size, self.rows_per_sentence = model, beam_size, 1
        self.first_group = 1 if shapes_change and model.output_size >= 2 * beam_size else beam_size
        context, caches = model.start_cache(source, max_len * beam_size)
        n = ops.shape(source)[0]
        self.initial = (context, ops.zeros((n, beam_size, max_len * beam_size), "bool"), caches)  # history (N, K, L*K)
        self.output_matrix = model.output_matrix()  # (V', d), the same at every step
        self.slots = ops.expand_dims(ops.arange(beam_size, dtype="int32"), 1)  # (K, 1)
        self.entries = ops.expand_dims(ops.arange(max_len * beam_size, dtype="int32"), 0)  # (1, L*K)

    def step(self, tokens, t, state):
        context, history, caches = state
        group = ops.shape(tokens)[0] // ops.shape(history)[0]  # G: the hypotheses this step extends a sentence
        first = ops.where(t == 0, 0, self.first_group + (t - 1) * self.beam_size)  # the entry slot 0 writes
        written = ops.equal(self.entries, first + self.slots)  # (K, L*K) the entries step t writes
        history = ops.logical_or(history, ops.expand_dims(written, 0))  # (N, K, L*K)
        held = history[:, :group, :self.model.cache_entries(caches, group)]  # (N, G, the cache's entries)
        logits, caches = self.model.decode_step(tokens, t, context, caches, target_mask=held, group=group,
                                                cache_index=first, output_matrix=self.output_matrix)  # (N*G, V')
        return logits, (context, history, caches)

    def reorder(self, state, parents):
        context, history, caches = state
        return context, gather_beams(history, parents), caches  # (N, K, L*K)


def beam_loop(model, source, max_len, min_len, beam_size, alpha, stop="bound", shrink=False):
    """Batched beam search as one loop in the graph; see `beam_search`.

    Every sentence's K hypotheses are K decoding rows; the caches follow them as the model's
    kernels say (ReorderedCache, or InPlaceBeamCache where model.kernels.in_place_beam_cache).

    Args:
      source: (N, T1) ids.
      max_len: L, a Python int, or an int scalar tensor in a traced graph (`one_graph`); min_len: int
        scalar tensor.
      beam_size: K (Python int); alpha: length penalty exponent (Python float); stop: beam_step's.
      shrink: set sentences aside once they are done (`set_aside`), and extend each sentence's one
        open hypothesis alone at the first step (InPlaceBeamCache): one graph only, whose shapes may change.

    Returns:
      ids (N, L) of each sentence's best hypothesis (<pad> after </s>), and its log-probability (N,).
    """
    n = ops.shape(source)[0]
    layout = InPlaceBeamCache if model.kernels.in_place_beam_cache else ReorderedCache
    cache = layout(model, source, max_len, beam_size, shapes_change=shrink)

    def cond(t, tokens, state, cache_state, aside):
        return ops.logical_and(t < max_len, ops.logical_not(ops.all(state["done"])))

    def body(t, tokens, state, cache_state, aside):
        logits, cache_state = cache.step(tokens, t, cache_state)  # (N*G, V')
        state, parents, tokens = beam_step(model, t, logits, min_len, max_len, beam_size, alpha, state, stop)
        cache_state = cache.reorder(cache_state, parents)
        if shrink:
            (state, tokens, cache_state), aside = set_aside(
                state["done"], [(state, 1), (tokens, beam_size), (cache_state, cache.rows_per_sentence)], aside,
                lambda: beam_result(state))
        return t + 1, tokens, state, cache_state, aside

    start = (ops.convert_to_tensor(0, "int32"), ops.full((n * cache.first_group,), BOS, "int32"),
             beam_start(n, beam_size, max_len), cache.initial, nothing_aside(n, max_len) if shrink else ())
    _, _, state, _, aside = ops.while_loop(cond, body, start)
    return put_back(aside, beam_result(state)) if shrink else beam_result(state)


# 4. Shrinking batches: the sentences still being decoded, the others set aside

def nothing_aside(n, max_len):
    """What a shrinking loop carries besides its live tensors, before any sentence is set aside: each
    live sentence's row in the batch (n,), and the results by row, ids (N, L) and scores (N,)."""
    return ops.arange(n, dtype="int32"), (ops.zeros((n, max_len), "int32"), ops.zeros((n,), "float32"))


def put_back(aside, results, which=None):
    """aside's results by row with results (ids (n, L), scores (n,)) of its live sentences, or of
    those at the indices `which` (m,), written at their rows."""
    rows, outputs = aside
    if which is not None:
        rows, results = ops.take(rows, which), [ops.take(r, which, axis=0) for r in results]  # (m,), (m, ...)
    return tuple(ops.scatter_update(out, ops.expand_dims(rows, 1), result) for out, result in zip(outputs, results))


def set_aside(done, live, aside, results):
    """Once some of the sentences a loop decodes are done, it keeps the open ones' rows alone (at
    least one row: the last step may leave none open); the done ones' results go to aside's outputs
    (put_back, at their rows) and every tensor of live keeps only the kept rows.

    Each step costs in proportion to the rows it computes, and the sentences of a batch end at
    different steps: a batch's last steps often decode a few of its sentences. A loop traced as one
    graph (`one_graph`) takes tensors whose rows change from step to step; XLA and JAX fix every
    shape. Each time sentences end, every live tensor (the caches too) is copied once, and each new
    row count costs the first step that meets it; dropping the done rows at once still costs less
    than computing on with them (docs/speed.md, "Only the rows and columns a step needs").

    Args:
      done: (n,) bool.
      live: a list of (tensors, R): nested tensors whose first axis holds R rows a sentence, adjacent
        (n*R rows).
      aside: (rows (n,), outputs), as nothing_aside made it and set_aside keeps it.
      results: a function giving (ids (n, L), scores (n,)) of the n sentences, called only when
        some are set aside.

    Returns:
      (live, aside), live's tensors and aside's rows with the kept sentences'.
    """
    n = ops.shape(done)[0]
    size = ops.maximum(n - ops.sum(ops.cast(done, "int32")), 1)  # the rows to keep: the open sentences'

    def drop():
        order = ops.concatenate([ops.nonzero(ops.logical_not(done))[0], ops.nonzero(done)[0]])  # (n,) open first
        stay, gone = order[:size], order[size:]  # (size,), (n - size,)
        outputs = put_back(aside, results(), which=gone)
        kept = []
        for tensors, per in live:
            rows = ops.reshape(ops.expand_dims(stay * per, 1) + ops.arange(per, dtype=stay.dtype), (-1,))  # (R*size,)
            kept.append(keras.tree.map_structure(lambda x, rows=rows: ops.take(x, rows, axis=0), tensors))
        return kept, (ops.take(aside[0], stay), outputs)

    return ops.cond(size < n, drop, lambda: ([tensors for tensors, _ in live], aside))


# Compiled, and called on NumPy batches

def one_graph_loops(model):
    """Whether the model's decoding loops run as one TensorFlow graph for every batch shape
    (`one_graph`: TensorFlow without XLA, a CPU's default), a batch shrinking as its sentences end;
    elsewhere they are compiled for each batch shape (XLA, JAX) or run eagerly (PyTorch), and a
    batch keeps its rows to its end."""
    return keras.backend.backend() == "tensorflow" and not model.xla_decoding


def compiled(model, fn, static=()):
    """fn(model, ...) (`greedy_loop`, `beam_loop` or `uncached_greedy_step`) as a function of the
    rest of its arguments, compiled where the backend allows it; static names the arguments that
    fix shapes or the loop's form (Python values, passed by name).

    On TensorFlow the decoding loops run as the model was built to (model.xla_decoding, the
    --jit_compile setting): compiled whole by XLA (`jit_compile`: one call per batch, fused kernels,
    buffers updated in place, but a compilation for each batch shape and static value, seconds
    each), or as one TensorFlow graph for every batch shape and output length (`one_graph`:
    traced once, nothing to compile, each op run on its own; the batch shrinks as its sentences
    end, `set_aside`). The reference's uncached step is a
    tf.function with relaxed shapes (one trace for every prefix length). AutoGraph is off: the
    loops are `ops.while_loop` already, with no Python control flow over tensors to rewrite (about
    half a second less before the first translation). On JAX, each is a `jax.jit` function of the
    model's variables (passed in, so later training is seen) and its arguments, `static` given as
    its static_argnames. PyTorch runs eagerly.
    """
    cache = model.__dict__.setdefault("_compiled_fns", {})
    if fn not in cache:
        bound = functools.partial(fn, model)
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf
            loop = fn in (greedy_loop, beam_loop)
            if loop and one_graph_loops(model):
                bound = one_graph(model, fn)
            else:
                bound = tf.function(bound, jit_compile=loop, reduce_retracing=not loop, autograph=False)
                tf.get_logger().addFilter(expected_retracing)  # once: a logger keeps one copy of a filter
        elif keras.backend.backend() == "jax":
            bound = jax_jit(model, bound, static)
        cache[fn] = bound
    return cache[fn]


def one_graph(model, fn):
    """A decoding loop of model's, fn(model, source, max_len, min_len, **rest) (`greedy_loop`,
    `beam_loop`, its batch shrinking), as one TensorFlow graph that takes every batch shape and
    output length: source (N, T1) of any shape and max_len as tensors, traced once for each value
    of the rest (the beam's size, alpha, stop). Where model.graph_folder names a folder, a graph that
    any process traced there for the same model, code and settings is read instead
    (support.graphs.kept, which also calls it)."""
    import tensorflow as tf

    from support import graphs as kept_graphs

    graphs, calls, read = {}, {}, []
    signature = (tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((), tf.int32), tf.TensorSpec((), tf.int32))

    def run(source, max_len, min_len, **rest):
        key = tuple(sorted(rest.items()))
        if key not in calls:
            loop = functools.partial(fn, model, shrink=True, **rest)
            graphs[key] = tf.function(loop, input_signature=signature, autograph=False)
            calls[key], found = kept_graphs.kept(model, fn, rest, graphs[key])
            read.append(found)
        return calls[key](source, max_len, min_len)

    run.graphs = graphs  # one tf.function for each value of the rest (the tests count their traces)
    run.read = read  # for each, whether its graph was read from model.graph_folder, not traced
    return run


def expected_retracing(record):
    """False for TensorFlow's warning that a decoding loop was traced again: the loops compile once
    per batch shape on purpose (length-sorted batches come in many), so the warning's advice does
    not apply; a warning about any other function is kept."""
    message = record.getMessage()
    return not ("triggered tf.function retracing" in message
                and any(f"<function {name} " in message for name in ("greedy_loop", "beam_loop")))


def jax_jit(model, fn, static=()):
    """fn(*args, **kwargs) as a jax.jit function that reads the model's variables as an argument,
    the keyword arguments named in static static (jax.jit's static_argnames).

    A plain jax.jit would bake the weights in as constants at the first call, and decoding
    after more training would use the old ones.
    """
    import jax

    def stateless(values, *args, **kwargs):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            return fn(*args, **kwargs)

    jitted = jax.jit(stateless, static_argnames=tuple(static))
    return lambda *args, **kwargs: jitted([v.value for v in model.variables], *args, **kwargs)


def trim(ids, scores, return_scores):
    """Drop the all-<pad> columns at the end of decoded ids (N, L)."""
    used = np.nonzero((ids != PAD).any(axis=0))[0]
    ids = ids[:, :used[-1] + 1] if len(used) else ids[:, :1]
    return (ids, scores.astype(np.float64)) if return_scores else ids


def greedy_decode(model, source, max_len=None, min_len=0, cached=True, return_scores=False):
    """Translate a batch greedily, stopping once every sentence has produced </s>.

    Args:
      source: (N, T1) ids (with </s>, right-padded).
      max_len: most output tokens; default `default_max_len(T1)`.
      min_len: </s> is not allowed before this many tokens (benchmarks force lengths with it).
      cached: decode one token per step with key/value caches, the whole loop compiled;
        False re-runs the whole decoder over the prefix at every step, as the reference does.
      return_scores: also return each output's log-probability.

    Returns:
      (N, L') int32 NumPy array: the output ids, </s> included, <pad> after it
      [, (N,) float log-probabilities].
    """
    source = ops.convert_to_tensor(source, "int32")
    max_len = default_max_len(model, int(ops.shape(source)[1])) if max_len is None else max_len
    if cached:
        ids, scores = compiled(model, greedy_loop, static=("max_len",))(
            source, max_len=max_len, min_len=ops.convert_to_tensor(min_len, "int32"))
        return trim(ops.convert_to_numpy(ids), ops.convert_to_numpy(scores), return_scores)
    n = int(ops.shape(source)[0])
    memory, source_mask = model.encode(source, training=False)  # (N, T1, d)
    step_fn = compiled(model, uncached_greedy_step)
    target_in = np.full((n, 1), BOS, np.int32)  # (N, 1)
    finished = np.zeros(n, bool)  # (N,)
    scores = np.zeros(n, np.float64)  # (N,)
    outputs = []
    for t in range(max_len):
        next_ids, chosen = step_fn(ops.convert_to_tensor(target_in), memory, source_mask,
                                   ops.convert_to_tensor(t >= min_len))  # (N,), (N,)
        next_ids = ops.convert_to_numpy(next_ids).copy()  # (N,)
        scores += np.where(finished, 0.0, ops.convert_to_numpy(chosen))
        next_ids[finished] = PAD
        outputs.append(next_ids)
        finished |= next_ids == EOS
        if finished.all():
            break
        target_in = np.concatenate([target_in, next_ids[:, None]], axis=1)  # (N, t+1)
    ids = np.stack(outputs, axis=1)  # (N, L')
    return (ids, scores) if return_scores else ids


def beam_search(model, source, beam_size=4, alpha=0.6, max_len=None, min_len=0, return_scores=False, stop="bound"):
    """Batched beam search with the GNMT length penalty ((5 + length) / 6) ** alpha, the whole
    loop compiled (`beam_loop`). With beam_size 1 and alpha 0 this is greedy decoding.

    Args:
      source: (N, T1) ids.
      beam_size: K.
      alpha: length penalty exponent; 0 ranks by log-probability alone.
      max_len, min_len: as in greedy_decode.
      return_scores: also return each output's log-probability (without the penalty).
      stop: when a sentence is done: "bound" or "finished" (beam_step).

    Returns:
      (N, L') int32 ids, </s> included, <pad> after it [, (N,) log-probabilities].
    """
    source = ops.convert_to_tensor(source, "int32")
    max_len = default_max_len(model, int(ops.shape(source)[1])) if max_len is None else max_len
    search = compiled(model, beam_loop, static=("max_len", "beam_size", "alpha", "stop"))
    ids, scores = search(source, max_len=max_len, min_len=ops.convert_to_tensor(min_len, "int32"),
                         beam_size=int(beam_size), alpha=float(alpha), stop=stop)
    return trim(ops.convert_to_numpy(ids), ops.convert_to_numpy(scores), return_scores)
