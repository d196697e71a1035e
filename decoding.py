"""How a trained model writes: from source ids to output ids, and from lines of text to translations.

In the order a reader meets them: the reference's greedy decoding, which re-runs the whole decoder
over the prefix for every new token (`uncached_greedy_step`); greedy decoding with key/value caches,
one position per step (`greedy_loop`); batched beam search with the GNMT length penalty, the
caches reordered with one gather per step (`beam_loop` with `ReorderedCache`), or kept in place
(`InPlaceBeamCache`, --kernels' beam_cache). `greedy_decode` and `beam_search` run them compiled
(`compiled`). Then text: sentences batched by length under a token budget (`translate`), and lines longer than the model
was trained on cut into pieces that are translated one by one and joined (`translate_lines`).

Shapes: N sentences, T1 source length, K beam size, L the most output tokens (the cache length),
V' the logits columns, d d_model, h heads, d_k d_model / h.
"""
import functools
import re
import sys
import warnings

import keras
import numpy as np
from keras import ops
from tqdm import tqdm

import data_load
from data_load import BOS, EOS, PAD
from modules import NEG_INF
from utils import UserError


# Arguments of the decoding functions that fix shapes or the loop's form: static under jax.jit.
JAX_STATIC_ARGS = {"greedy_loop": (1,), "beam_loop": (1, 3, 4)}

def default_max_len(model, source_length):
    """Most output tokens for a source of this (padded) length: 1.5 * T1 + 10, and no more than a
    learned position table holds. source_length: a Python int, or an int scalar tensor in a traced
    graph (serving.py's SavedModel), which gets one back."""
    max_len = 3 * source_length // 2 + 10  # 1.5 * T1 rounded down, + 10
    if model.positional != "learned":
        return max_len
    return min(max_len, model.maxlen2) if isinstance(max_len, int) else ops.minimum(max_len, model.maxlen2)


def bar_tokens(log_probs, allow_eos):
    """log_probs (N, V) with <pad> and <s> set to -inf, and </s> too unless allow_eos (a boolean
    scalar). No target holds <pad> or <s>, and a chosen <pad> would read as padding to the uncached
    decoder and to the output; columns 0-3 are ids 0-3 whatever the output vocabulary."""
    column = ops.arange(ops.shape(log_probs)[-1])  # (V,)
    never = ops.logical_or(ops.equal(column, PAD), ops.equal(column, BOS))  # (V,)
    barred = ops.logical_or(never, ops.logical_and(ops.equal(column, EOS), ops.logical_not(allow_eos)))
    return ops.where(barred, -np.inf, log_probs)  # (N, V)


def greedy_choice(model, log_probs, allow_eos):
    """The most likely next token (N,) and its log-probability (N,); never <pad> or <s>, and
    never </s> unless allowed.
    log_probs (N, V') over the logits columns (columns 0-3 are ids 0-3 either way)."""
    log_probs = bar_tokens(log_probs, allow_eos)  # (N, V')
    best = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # (N,) columns
    return model.to_ids(best), ops.take_along_axis(log_probs, ops.expand_dims(best, 1), axis=1)[:, 0]


# 1. The reference's way: the whole decoder over the prefix, for every new token

def uncached_greedy_step(model, target_in, memory, source_mask, allow_eos):
    """The reference's step: the whole decoder over the prefix (N, t), logits for every position,
    the last one used -> (next ids (N,), their log-probabilities (N,))."""
    with warnings.catch_warnings():  # the first step attends over one key: a softmax over an axis of size 1
        warnings.filterwarnings("ignore", message="You are using a softmax over axis")
        logits = model.decode(target_in, memory, source_mask, training=False)[:, -1]  # (N, V)
    return greedy_choice(model, ops.log_softmax(ops.cast(logits, "float32"), axis=-1), allow_eos)


# 2. Cached: one new position a step, the earlier keys and values kept

def start_decoding(model, source, max_len, repeat=1):
    """Encode once; compute every cross-attention's keys/values once; empty self-attention caches.

    Args:
      source: (N, T1) ids.
      max_len: L, the cache length.
      repeat: K, decoding rows per sentence (beam search's hypotheses), adjacent.

    Returns:
      (cross_caches, source_mask, caches) for `decode_step`, each with N*K rows: per decoder block
      the encoder output's keys and values, each (N*K, h, T1, d_k), and an empty self-attention
      cache, keys and values each (N*K, h, L, d_k); source_mask (N*K, T1).
    """
    memory, source_mask = model.encode(source, training=False)  # (N, T1, d)
    cross_caches = [tuple(ops.repeat(t, repeat, axis=0) for t in block.cross_attention.keys_values(memory))
                    for block in model.decoder_blocks]  # (N*K, h, T1, d_k) each
    shape = (ops.shape(memory)[0] * repeat, model.num_heads, max_len, model.d_model // model.num_heads)
    caches = [(ops.zeros(shape, memory.dtype), ops.zeros(shape, memory.dtype))
              for _ in model.decoder_blocks]  # (N*K, h, L, d_k) each
    return cross_caches, ops.repeat(source_mask, repeat, axis=0), caches


def decode_step(model, tokens, step, cross_caches, source_mask, caches, target_mask=None, group=1):
    """One decoding step with caches: the previous tokens (N*G,) at position `step` ->
    log-probabilities of the next token over the logits columns (N*G, V') and the updated caches.

    By default (G = 1) every row has its own cache and sees its entries 0..step. With group G,
    the G adjacent rows of a sentence share one cache (InPlaceBeamCache): they enter the decoder
    blocks as G queries of one row, all at position `step`, write entries step*G..step*G+G-1, and
    target_mask (N, G, L) says which entries each may see. So the cache index the blocks get is
    an entry, not a position: the position reaches the model through embed_target's start alone.
    """
    if target_mask is None:
        target_mask = ops.expand_dims(ops.less_equal(ops.arange(ops.shape(caches[0][0])[2]), step), 0)  # (1, L)
    y = model.embed_target(ops.expand_dims(tokens, 1), training=False, start=step)  # (N*G, 1, d)
    y = ops.reshape(y, (-1, group, model.d_model))  # (N, G, d)
    new_caches = []
    for block, cross_cache, cache in zip(model.decoder_blocks, cross_caches, caches):
        y, cache = block(y, None, target_mask, source_mask, self_cache=cache, cross_cache=cross_cache,
                         cache_index=step * group)  # (N, G, d)
        new_caches.append(cache)
    y = ops.reshape(y, (-1, 1, model.d_model))  # (N*G, 1, d)
    logits = model.logits(y)[:, 0]  # (N*G, V')
    return ops.log_softmax(ops.cast(logits, "float32"), axis=-1), new_caches  # (N*G, V')


def greedy_loop(model, source, max_len, min_len):
    """Cached greedy decoding as one loop in the graph (`ops.while_loop`): encode, then one
    token per step until every sentence has produced </s> or max_len tokens.

    Args:
      source: (N, T1) ids.
      max_len: L, an int, or an int scalar tensor in a traced graph (serving.py's SavedModel).
        It fixes the output and cache shapes.
      min_len: int scalar tensor: </s> is barred before this many tokens.

    Returns:
      ids (N, L) with <pad> after </s>, and log-probabilities (N,).
    """
    cross_caches, source_mask, caches = start_decoding(model, source, max_len)
    n = ops.shape(source)[0]

    def cond(t, tokens, finished, ids, scores, caches):
        return ops.logical_and(t < max_len, ops.logical_not(ops.all(finished)))

    def body(t, tokens, finished, ids, scores, caches):
        log_probs, caches = decode_step(model, tokens, t, cross_caches, source_mask, caches)  # (N, V')
        next_ids, chosen = greedy_choice(model, log_probs, t >= min_len)  # (N,), (N,)
        next_ids = ops.where(finished, PAD, next_ids)  # (N,)
        scores = scores + ops.where(finished, 0.0, chosen)  # (N,)
        ids = ops.slice_update(ids, (0, t), ops.expand_dims(next_ids, 1))  # (N, L)
        return t + 1, next_ids, ops.logical_or(finished, ops.equal(next_ids, EOS)), ids, scores, caches

    start = (ops.convert_to_tensor(0, "int32"), ops.full((n,), BOS, "int32"), ops.zeros((n,), "bool"),
             ops.zeros((n, max_len), "int32"), ops.zeros((n,), "float32"), caches)
    _, _, _, ids, scores, _ = ops.while_loop(cond, body, start)
    return ids, scores


# 3. Beam search: the K best hypotheses of every sentence, extended together

def gather_beams(x, beams):
    """x (N, K', ...) -> the rows `beams` (N, J) of each sentence: (N, J, ...)."""
    for _ in range(len(x.shape) - 2):
        beams = ops.expand_dims(beams, -1)  # (N, J, 1, ...)
    return ops.take_along_axis(x, beams, axis=1)


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, section 7)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def beam_step(model, t, log_probs, min_len, max_len, alpha, state):
    """Choose among the K x V' extensions of every sentence's open hypotheses (one beam step).

    Of the 2K best candidates, those among the best K that end in </s> compete, by
    log-probability over the length penalty, for the K finished slots; the best K others stay
    open. A sentence is done once the best score an open hypothesis could still reach (its
    log-probability over the penalty at max_len: log-probabilities only fall) cannot beat its best
    finished one.

    Args:
      log_probs: (N*K, V') next-token log-probabilities of the open hypotheses.
      state: dict of alive_seqs (N, K, L), alive_scores (N, K), fin_seqs (N, K, L), fin_norm
        (N, K) finished scores over the penalty, fin_scores (N, K), done (N,).

    Returns:
      (the new state, parents (N, K): the hypothesis each open one extends, tokens (N*K,)).
    """
    n, k = ops.shape(state["alive_scores"])[0], ops.shape(state["alive_scores"])[1]
    vocab = model.output_size
    # 1. extend: the 2K best of K x V' candidates per sentence
    log_probs = ops.reshape(bar_tokens(log_probs, t >= min_len), (n, k, vocab))  # (N, K, V')
    candidates = ops.reshape(log_probs + ops.expand_dims(state["alive_scores"], -1), (n, k * vocab))
    top_scores, top = ops.top_k(candidates, 2 * k)  # (N, 2K)
    top = ops.cast(top, "int32")  # (N, 2K) candidate = beam * V' + column
    top_beams, top_tokens = top // vocab, model.to_ids(top % vocab)  # (N, 2K)
    top_seqs = ops.slice_update(gather_beams(state["alive_seqs"], top_beams), (0, 0, t),
                                ops.expand_dims(top_tokens, -1))  # (N, 2K, L)
    is_eos = ops.equal(top_tokens, EOS)  # (N, 2K)
    # 2. finished: </s> among the best K candidates of a sentence not yet done
    eligible = ops.logical_and(is_eos, ops.arange(2 * k) < k)  # (N, 2K)
    eligible = ops.logical_and(eligible, ops.logical_not(ops.expand_dims(state["done"], 1)))
    new_norm = ops.where(eligible, top_scores / length_penalty(t + 1, alpha), NEG_INF)  # (N, 2K)
    fin_norm, keep = ops.top_k(ops.concatenate([state["fin_norm"], new_norm], axis=1), k)  # (N, K)
    fin_seqs = gather_beams(ops.concatenate([state["fin_seqs"], top_seqs], axis=1), keep)  # (N, K, L)
    fin_scores = ops.take_along_axis(ops.concatenate([state["fin_scores"], top_scores], axis=1), keep, axis=1)
    # 3. open: the best K candidates that do not end in </s>
    open_scores, pick = ops.top_k(ops.where(is_eos, NEG_INF, top_scores), k)  # (N, K)
    parents = ops.take_along_axis(top_beams, pick, axis=1)  # (N, K)
    tokens = ops.reshape(ops.take_along_axis(top_tokens, pick, axis=1), (-1,))  # (N*K,)
    # 4. done: no open hypothesis can beat the best finished one
    bound = ops.max(open_scores, axis=1) / length_penalty(max_len, alpha)  # (N,)
    done = ops.logical_or(state["done"], ops.logical_and(fin_norm[:, 0] > NEG_INF / 2, bound <= fin_norm[:, 0]))
    state = dict(alive_seqs=gather_beams(top_seqs, pick), fin_seqs=fin_seqs, fin_norm=fin_norm,
                 fin_scores=fin_scores, done=done,
                 alive_scores=ops.where(ops.expand_dims(done, 1), NEG_INF, open_scores))
    return state, parents, tokens


def beam_start(n, k, max_len):
    """The beam state before the first step: K copies of the empty hypothesis, of which one is open
    (the others at NEG_INF, so the first step does not pick the same extension K times)."""
    first = ops.concatenate([ops.zeros((n, 1)), ops.full((n, k - 1), NEG_INF)], axis=1)  # (N, K)
    return dict(alive_seqs=ops.zeros((n, k, max_len), "int32"), alive_scores=first,
                fin_seqs=ops.zeros((n, k, max_len), "int32"), fin_norm=ops.full((n, k), NEG_INF),
                fin_scores=ops.full((n, k), NEG_INF), done=ops.zeros((n,), "bool"))


def beam_result(state):
    """Each sentence's best finished hypothesis, or its best open one if none finished within
    max_len: ids (N, L) and log-probability (N,)."""
    has_finished = ops.expand_dims(state["fin_norm"][:, 0] > NEG_INF / 2, 1)  # (N, 1)
    best_open = ops.expand_dims(ops.cast(ops.argmax(state["alive_scores"], axis=1), "int32"), 1)  # (N, 1)
    ids = ops.where(has_finished, state["fin_seqs"][:, 0],
                    gather_beams(state["alive_seqs"], best_open)[:, 0])  # (N, L)
    scores = ops.where(has_finished[:, 0], state["fin_scores"][:, 0],
                       ops.take_along_axis(state["alive_scores"], best_open, axis=1)[:, 0])  # (N,)
    return ids, scores


class ReorderedCache:
    """Beam search's caches, a row per hypothesis: start_decoding's with the encoder output's
    keys/values repeated K times. After each step the rows are reordered with one gather, so that
    row j holds the history of the hypothesis now in slot j.

    `initial` is the loop's cache state; `step(tokens, t, state)` gives the next-token
    log-probabilities (N*K, V') and the new state; `reorder(state, parents)` follows parents (N, K).
    """

    def __init__(self, model, source, max_len, beam_size):
        self.model = model
        self.cross_caches, self.source_mask, self.initial = start_decoding(model, source, max_len, repeat=beam_size)
        self.first_row = ops.expand_dims(ops.arange(ops.shape(source)[0], dtype="int32") * beam_size, 1)  # (N, 1)

    def step(self, tokens, t, caches):
        return decode_step(self.model, tokens, t, self.cross_caches, self.source_mask, caches)  # (N*K, V')

    def reorder(self, caches, parents):
        rows = ops.reshape(self.first_row + parents, (-1,))  # (N*K,) the row each hypothesis came from
        return [tuple(ops.take(c, rows, axis=0) for c in cache) for cache in caches]  # (N*K, h, L, d_k) each


class InPlaceBeamCache:
    """Beam search's caches without reordering (--kernels' beam_cache): the K hypotheses of a
    sentence share one cache, entry p * K + k holding the key/value written at step p by the
    hypothesis then in slot k. Rows never move; each hypothesis carries the mask of its ancestors'
    entries (`history`, reordered instead of the caches), and the encoder output's keys/values are
    kept once per sentence, not K times. Each step runs decode_step with the K hypotheses of a
    sentence as K queries of one row. Methods as ReorderedCache's."""

    def __init__(self, model, source, max_len, beam_size):
        self.model, self.k = model, beam_size
        self.cross_caches, self.source_mask, caches = start_decoding(model, source, max_len * beam_size)
        n = ops.shape(source)[0]
        self.initial = (ops.zeros((n, beam_size, max_len * beam_size), "bool"), caches)  # history (N, K, L*K)
        self.slots = ops.expand_dims(ops.arange(beam_size, dtype="int32"), 1)  # (K, 1)
        self.entries = ops.expand_dims(ops.arange(max_len * beam_size, dtype="int32"), 0)  # (1, L*K)

    def step(self, tokens, t, state):
        history, caches = state
        written = ops.equal(self.entries, t * self.k + self.slots)  # (K, L*K) the entries step t writes
        history = ops.logical_or(history, ops.expand_dims(written, 0))  # (N, K, L*K)
        log_probs, caches = decode_step(self.model, tokens, t, self.cross_caches, self.source_mask, caches,
                                        target_mask=history, group=self.k)  # (N*K, V')
        return log_probs, (history, caches)

    def reorder(self, state, parents):
        history, caches = state
        return gather_beams(history, parents), caches  # (N, K, L*K)


def beam_loop(model, source, max_len, min_len, beam_size, alpha):
    """Batched beam search as one loop in the graph; see `beam_search`.

    Every sentence's K hypotheses are K decoding rows; the caches follow them as the model's
    kernels say (ReorderedCache, or InPlaceBeamCache with beam_cache).

    Args:
      source: (N, T1) ids.
      max_len: L (Python int); min_len: int scalar tensor.
      beam_size: K (Python int); alpha: length penalty exponent (Python float).

    Returns:
      ids (N, L) of each sentence's best hypothesis (<pad> after </s>), and its log-probability (N,).
    """
    k, n = beam_size, ops.shape(source)[0]
    layout = InPlaceBeamCache if "beam_cache" in model.kernels else ReorderedCache
    cache = layout(model, source, max_len, k)

    def cond(t, tokens, state, cache_state):
        return ops.logical_and(t < max_len, ops.logical_not(ops.all(state["done"])))

    def body(t, tokens, state, cache_state):
        log_probs, cache_state = cache.step(tokens, t, cache_state)  # (N*K, V')
        state, parents, tokens = beam_step(model, t, log_probs, min_len, max_len, alpha, state)
        return t + 1, tokens, state, cache.reorder(cache_state, parents)

    start = (ops.convert_to_tensor(0, "int32"), ops.full((n * k,), BOS, "int32"), beam_start(n, k, max_len),
             cache.initial)
    _, _, state, _ = ops.while_loop(cond, body, start)
    return beam_result(state)


# Compiled, and called on NumPy batches

def compiled(model, name):
    """`greedy_loop`, `beam_loop` or `uncached_greedy_step`, compiled where the backend allows it.

    On TensorFlow, the decoding loops are compiled whole by XLA (`jit_compile`): one call per
    batch, fused kernels, buffers updated in place; XLA compiles once per batch shape and
    max_len. The reference's uncached step is a tf.function with relaxed shapes (one trace for
    every prefix length). AutoGraph is off: the loops are `ops.while_loop` already, with no Python
    control flow over tensors to rewrite (about half a second less before the first translation).
    On JAX, each is a `jax.jit` function of the model's variables (passed in, so later training
    is seen) and its arguments, the Python ints static. PyTorch runs eagerly.
    """
    cache = model.__dict__.setdefault("_compiled_fns", {})
    if name not in cache:
        fn = functools.partial(globals()[name], model)
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf
            loop = name.endswith("_loop")
            fn = tf.function(fn, jit_compile=loop, reduce_retracing=not loop, autograph=False)
            tf.get_logger().addFilter(expected_retracing)  # once: a logger keeps one copy of a filter
        elif keras.backend.backend() == "jax":
            fn = jax_jit(model, fn, static=JAX_STATIC_ARGS.get(name, ()))
        cache[name] = fn
    return cache[name]


def expected_retracing(record):
    """False for TensorFlow's warning that a decoding loop was traced again: the loops compile once
    per batch shape on purpose (length-sorted batches come in many), so the warning's advice does
    not apply; a warning about any other function is kept."""
    message = record.getMessage()
    return not ("triggered tf.function retracing" in message
                and any(f"<function {name} " in message for name in ("greedy_loop", "beam_loop")))


def jax_jit(model, fn, static=()):
    """fn(*args) as a jax.jit function that reads the model's variables as an argument.

    A plain jax.jit would bake the weights in as constants at the first call, and decoding
    after more training would use the old ones.
    """
    import jax

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            return fn(*args)

    jitted = jax.jit(stateless, static_argnums=tuple(i + 1 for i in static))
    return lambda *args: jitted([v.value for v in model.variables], *args)


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
        ids, scores = compiled(model, "greedy_loop")(source, max_len, ops.convert_to_tensor(min_len, "int32"))
        return trim(ops.convert_to_numpy(ids), ops.convert_to_numpy(scores), return_scores)
    n = int(ops.shape(source)[0])
    memory, source_mask = model.encode(source, training=False)  # (N, T1, d)
    step_fn = compiled(model, "uncached_greedy_step")
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


def beam_search(model, source, beam_size=4, alpha=0.6, max_len=None, min_len=0, return_scores=False):
    """Batched beam search with the GNMT length penalty ((5 + length) / 6) ** alpha, the whole
    loop compiled (`beam_loop`). With beam_size 1 and alpha 0 this is greedy decoding.

    Args:
      source: (N, T1) ids.
      beam_size: K.
      alpha: length penalty exponent; 0 ranks by log-probability alone.
      max_len, min_len: as in greedy_decode.
      return_scores: also return each output's log-probability (without the penalty).

    Returns:
      (N, L') int32 ids, </s> included, <pad> after it [, (N,) log-probabilities].
    """
    source = ops.convert_to_tensor(source, "int32")
    max_len = default_max_len(model, int(ops.shape(source)[1])) if max_len is None else max_len
    ids, scores = compiled(model, "beam_loop")(source, max_len, ops.convert_to_tensor(min_len, "int32"),
                                                int(beam_size), float(alpha))
    return trim(ops.convert_to_numpy(ids), ops.convert_to_numpy(scores), return_scores)


# Text: lines in, translations out, in order

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
    for idx in tqdm(batches, desc=desc, unit="batch", leave=False, disable=None):
        x = data_load.encoder_inputs([src_seqs[i] for i in idx], limit=model.maxlen1)
        ids = greedy_decode(model, x) if beam_size == 1 else beam_search(model, x, beam_size, alpha)
        for i, text in zip(idx, data_load.postprocess(sp, ids)):
            out[i] = text
    return out


SENTENCE_END = ".!?;:"  # a sentence ends at a word that ends in one of these
WORD_START = "\u2581"  # sentencepiece's mark of a word's first piece


def split_long(sp, text, max_tokens):
    """Token ids of text, in pieces of at most max_tokens: whole sentences packed greedily, a
    sentence too long for a piece word by word, a word too long for one (rare) cut anywhere.

    It works on the token ids, which are the words' own one after another (sentencepiece encodes
    each word alone): a word starts at a piece that starts with the mark ▁, a sentence at a word
    after one that ends in . ! ? ; or :. split_long_tensor is the same rule in TensorFlow ops.
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


def split_long_tensor(ids, vocabulary, max_tokens):
    """split_long in TensorFlow ops, for a graph that takes text (serving.py's SavedModel), over
    every line at once: ids a ragged (N, None) int32 tensor of each line's token ids (no </s>),
    vocabulary the (V,) string tensor of the pieces -> (the pieces, a ragged (P, None) tensor of
    ids; the line each came from (P,), in order). An empty line gives no piece.
    tests/test_decoding.py checks that the two agree."""
    import tensorflow as tf

    flat, line = ids.flat_values, ids.value_rowids()  # (M,) every line's ids, one after another
    first = tf.equal(tf.range(tf.size(flat), dtype=line.dtype), tf.gather(ids.row_starts(), line))  # (M,)
    piece = tf.gather(vocabulary, flat)  # (M,)
    word = first | tf.strings.regex_full_match(piece, WORD_START + ".*")  # (M,) a word starts here
    ends = tf.strings.regex_full_match(piece, f".*[{re.escape(SENTENCE_END)}]")  # (M,)
    sentence = first | (word & tf.concat([[False], ends[:-1]], 0))  # (M,) a sentence starts here
    ones = tf.ones_like(flat)

    def spans(starts):
        """The span each token is in (M,), and each span's length."""
        index = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # (M,)
        return index, tf.math.unsorted_segment_sum(ones, index, tf.reduce_sum(tf.cast(starts, tf.int32)))

    sentence_index, sentence_length = spans(sentence)
    unit_index, unit_length = spans(sentence | (word & (tf.gather(sentence_length, sentence_index) > max_tokens)))
    unit_line = tf.math.unsorted_segment_max(tf.cast(line, tf.int32), unit_index, tf.size(unit_length))  # (U,)

    def pack(state, unit):
        """Greedy packing, one unit at a time: (line, tokens in the open piece, pieces so far,
        this unit's first piece)."""
        last_line, current, count, _ = state
        length, unit_of_line = unit
        current = tf.where(tf.equal(unit_of_line, last_line), current, 0)  # a new line opens no piece
        join = (current > 0) & (current + length <= max_tokens)
        start = tf.where(join, count - 1, count)
        count = tf.where(join, count, count + (length + max_tokens - 1) // max_tokens)
        current = tf.where(join, current + length, tf.where(length <= max_tokens, length, 0))
        return unit_of_line, current, count, start

    zero = tf.constant(0, tf.int32)
    _, _, counts, unit_piece = tf.scan(pack, (unit_length, unit_line), (zero - 1, zero, zero, zero))
    offset = tf.range(tf.size(flat)) - tf.gather(tf.cumsum(unit_length, exclusive=True), unit_index)  # (M,)
    token_piece = tf.gather(unit_piece, unit_index) + offset // max_tokens  # (M,)
    count = tf.reduce_max(tf.concat([[0], counts], 0))  # P
    pieces = tf.RaggedTensor.from_value_rowids(flat, tf.cast(token_piece, tf.int64), nrows=tf.cast(count, tf.int64))
    owner = tf.math.unsorted_segment_max(tf.cast(line, tf.int32), token_piece, count)  # (P,)
    return pieces, owner


def translate_lines(model, sp, lines, maxlen1, tokens_per_batch, beam_size=1, alpha=0.6, desc="translate",
                    source=None, whole=False, first_line=1):
    """Translations of text lines, one per line, in order.

    Empty lines give empty lines. A line longer than maxlen1 - 1 tokens (room for </s>) is cut by
    split_long and its pieces are translated one by one and joined; with whole (evaluation, as the
    reference) it is translated whole, unless the model's learned positions stop at maxlen1. With
    `source` (a name for messages) a note on stderr says where a line was cut. Batches are formed
    by tokens, so memory stays bounded. first_line: the number of lines[0] in those messages.
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
    outputs = translate(model, sp, pieces, tokens_per_batch, beam_size, alpha, desc) if pieces else []
    translations = [""] * len(lines)
    for i, text in zip(owner, outputs):
        translations[i] = (translations[i] + " " + text).strip()
    return translations
