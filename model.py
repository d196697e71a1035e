"""The Transformer: encoder and decoder stacks over one shared embedding matrix.

`make_model(hp, vocab_size)` is the only place that reads hyperparameters; the layers in modules.py
take plain arguments. Shape letters as in modules.py.
"""
import warnings

import keras
import numpy as np
from keras import ops

from modules import (PACKAGE, DecoderBlock, EncoderBlock, GuardedAdam, LabelSmoothedCrossEntropy,
                     PositionalEncoding, TokenEmbedding, WarmupInverseSqrt, attention_bias)

PAD, BOS, EOS = 0, 2, 3
# The first greedy step attends over one key; Keras warns about a softmax over an axis of size 1.
warnings.filterwarnings("ignore", message="You are using a softmax over axis")


def mask_eos(log_probs, allow_eos):
    """log_probs (N, V) with </s> set to -inf unless allow_eos (a boolean scalar)."""
    is_eos = ops.equal(ops.arange(ops.shape(log_probs)[-1]), EOS)  # (V,)
    return ops.where(ops.logical_and(is_eos, ops.logical_not(allow_eos)), -np.inf, log_probs)  # (N, V)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Transformer(keras.Model):
    """Encoder-decoder Transformer (section 3) for translation.

    Call it on (source ids (N, T1), decoder input ids (N, T2)); it returns logits (N, T2, V).
    """

    def __init__(self, vocab_size, d_model, d_ff, num_blocks, num_heads, dropout_rate=0.1,
                 maxlen1=100, maxlen2=100, positional="sinusoid", **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.d_ff = vocab_size, d_model, d_ff
        self.num_blocks, self.num_heads, self.dropout_rate = num_blocks, num_heads, dropout_rate
        self.maxlen1, self.maxlen2, self.positional = maxlen1, maxlen2, positional
        self.embedding = TokenEmbedding(vocab_size, d_model, pad_id=PAD, name="embedding")
        self.source_position = PositionalEncoding(d_model, maxlen1, positional, name="source_position")
        self.target_position = PositionalEncoding(d_model, maxlen2, positional, name="target_position")
        self.source_dropout = keras.layers.Dropout(dropout_rate)
        self.target_dropout = keras.layers.Dropout(dropout_rate)
        self.encoder_blocks = [EncoderBlock(d_model, d_ff, num_heads, dropout_rate, name=f"encoder_{i}")
                               for i in range(num_blocks)]
        self.decoder_blocks = [DecoderBlock(d_model, d_ff, num_heads, dropout_rate, name=f"decoder_{i}")
                               for i in range(num_blocks)]

    def encode(self, source, training=None):
        """source (N, T1) ids -> memory (N, T1, d), source mask (N, T1) bool."""
        source_mask = ops.not_equal(source, PAD)  # (N, T1)
        x = self.source_position(self.embedding(source))  # (N, T1, d)
        x = self.source_dropout(x, training=training)  # (N, T1, d)
        for block in self.encoder_blocks:
            x = block(x, source_mask, training=training)  # (N, T1, d)
        return x, source_mask

    def decode(self, target_in, memory, source_mask, training=None):
        """target_in (N, T2) ids, memory (N, T1, d) -> logits (N, T2, V)."""
        target_mask = ops.not_equal(target_in, PAD)  # (N, T2)
        y = self.target_position(self.embedding(target_in))  # (N, T2, d)
        y = self.target_dropout(y, training=training)  # (N, T2, d)
        for block in self.decoder_blocks:
            y = block(y, memory, target_mask, source_mask, training=training)  # (N, T2, d)
        return self.embedding.project(y)  # (N, T2, V)

    def call(self, inputs, training=None):
        source, target_in = inputs  # (N, T1), (N, T2)
        memory, source_mask = self.encode(source, training=training)  # (N, T1, d)
        return self.decode(target_in, memory, source_mask, training=training)  # (N, T2, V)

    # Decoding. Shapes: K beam size, L the most output tokens (the cache length).

    def default_max_len(self, source_length):
        """Most output tokens for a source of this (padded) length: 1.5 * T1 + 10."""
        max_len = int(1.5 * source_length) + 10
        return min(max_len, self.maxlen2) if self.positional == "learned" else max_len

    def start_decoding(self, source, max_len, repeat=1):
        """Encode once; compute every cross-attention's keys/values once; empty self-attention caches.

        Args:
          source: (N, T1) ids.
          max_len: L, the cache length.
          repeat: K, copies of each sentence (beam search), adjacent.

        Returns:
          (memory_kv, source_bias, caches) for `decode_step`; rows are N*K.
        """
        memory, source_mask = self.encode(source, training=False)  # (N, T1, d)
        source_bias = attention_bias(source_mask, False, 1, ops.shape(source)[1], memory.dtype)  # (N, 1, 1, T1)
        if repeat > 1:
            memory = ops.repeat(memory, repeat, axis=0)  # (N*K, T1, d)
            source_bias = ops.repeat(source_bias, repeat, axis=0)  # (N*K, 1, 1, T1)
        memory_kv = [block.cross_attention.memory_heads(memory) for block in self.decoder_blocks]
        shape = (ops.shape(memory)[0], self.num_heads, max_len, self.d_model // self.num_heads)
        caches = [(ops.zeros(shape, memory.dtype), ops.zeros(shape, memory.dtype))
                  for _ in self.decoder_blocks]  # (N*K, h, L, d_k) each
        return memory_kv, source_bias, caches

    def decode_step(self, tokens, step, memory_kv, source_bias, caches):
        """One decoding step with caches: the previous tokens (N,) at position `step` ->
        log-probabilities of the next token (N, V) and the updated caches."""
        y = self.target_position(self.embedding(ops.expand_dims(tokens, 1)), start=step)  # (N, 1, d)
        new_caches = []
        for block, kv, (cache_k, cache_v) in zip(self.decoder_blocks, memory_kv, caches):
            y, cache_k, cache_v = block.call_step(y, kv, source_bias, cache_k, cache_v, step)  # (N, 1, d)
            new_caches.append((cache_k, cache_v))
        logits = self.embedding.project(y)[:, 0]  # (N, V)
        return ops.log_softmax(ops.cast(logits, "float32"), axis=-1), new_caches  # (N, V)

    @staticmethod
    def greedy_choice(log_probs, allow_eos):
        """The most likely next token (N,) and its log-probability (N,), </s> barred unless allowed."""
        log_probs = mask_eos(log_probs, allow_eos)  # (N, V)
        next_ids = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # (N,)
        return next_ids, ops.take_along_axis(log_probs, ops.expand_dims(next_ids, 1), axis=1)[:, 0]

    def greedy_step(self, tokens, step, allow_eos, memory_kv, source_bias, caches):
        """Cached greedy step: (next ids (N,), their log-probabilities (N,), caches)."""
        log_probs, caches = self.decode_step(tokens, step, memory_kv, source_bias, caches)  # (N, V)
        return (*self.greedy_choice(log_probs, allow_eos), caches)

    def uncached_greedy_step(self, target_in, memory, source_mask, allow_eos):
        """The reference's step: the whole decoder over the prefix (N, t), logits for every position,
        the last one used -> (next ids (N,), their log-probabilities (N,))."""
        logits = self.decode(target_in, memory, source_mask, training=False)[:, -1]  # (N, V)
        return self.greedy_choice(ops.log_softmax(ops.cast(logits, "float32"), axis=-1), allow_eos)

    def beam_step(self, tokens, step, allow_eos, alive_scores, memory_kv, source_bias, caches, beam_size):
        """Cached beam step: extend the K open hypotheses of each sentence by every token and keep
        the 2K best -> (scores (N, 2K), flat indices beam * V + token (N, 2K), caches).
        beam_size (K) is a Python int: fixed for a trace."""
        log_probs, caches = self.decode_step(tokens, step, memory_kv, source_bias, caches)  # (N*K, V)
        log_probs = mask_eos(log_probs, allow_eos)  # (N*K, V)
        n, k = ops.shape(alive_scores)[0], ops.shape(alive_scores)[1]
        candidates = ops.reshape(log_probs, (n, k, -1)) + ops.expand_dims(alive_scores, -1)  # (N, K, V)
        scores, indices = ops.top_k(ops.reshape(candidates, (n, -1)), 2 * beam_size)  # (N, 2K)
        return scores, ops.cast(indices, "int32"), caches

    @staticmethod
    def reorder_caches(caches, rows):
        """Caches of the hypotheses kept by beam search: rows (N*K,) of each (N*K, h, L, d_k)."""
        return [(ops.take(k, rows, axis=0), ops.take(v, rows, axis=0)) for k, v in caches]

    def compiled_fn(self, name):
        """`start_decoding`, `greedy_step`, `uncached_greedy_step`, `beam_step` or `reorder_caches`,
        compiled once for all shapes where the backend allows it.

        On TensorFlow a tf.function with relaxed shapes: one trace serves every step and prefix
        length, instead of running op by op in eager mode. Other backends run eagerly.
        """
        cache = self.__dict__.setdefault("_compiled_fns", {})
        if name not in cache:
            fn = getattr(self, name)
            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf
                fn = tf.function(fn, reduce_retracing=True)
            cache[name] = fn
        return cache[name]

    def greedy_decode(self, source, max_len=None, min_len=0, cached=True, return_scores=False):
        """Translate a batch greedily, stopping once every sentence has produced </s>.

        Args:
          source: (N, T1) ids (with </s>, right-padded).
          max_len: most output tokens; default `default_max_len(T1)`.
          min_len: </s> is not allowed before this many tokens (benchmarks force lengths with it).
          cached: decode one token per step with key/value caches; False re-runs the whole
            decoder over the prefix at every step, as the reference does.
          return_scores: also return each output's log-probability.

        Returns:
          (N, L') int32 NumPy array: the output ids, </s> included, <pad> after it
          [, (N,) float log-probabilities].
        """
        source = ops.convert_to_tensor(source, "int32")
        n = int(ops.shape(source)[0])
        max_len = self.default_max_len(int(ops.shape(source)[1])) if max_len is None else max_len
        if cached:
            memory_kv, source_bias, caches = self.compiled_fn("start_decoding")(source, max_len)
            step_fn = self.compiled_fn("greedy_step")
        else:
            memory, source_mask = self.encode(source, training=False)  # (N, T1, d)
            step_fn = self.compiled_fn("uncached_greedy_step")
        target_in = np.full((n, 1), BOS, np.int32)  # (N, 1)
        finished = np.zeros(n, bool)  # (N,)
        scores = np.zeros(n, np.float64)  # (N,)
        outputs = []
        for t in range(max_len):
            allow_eos = ops.convert_to_tensor(t >= min_len)
            if cached:
                next_ids, chosen, caches = step_fn(ops.convert_to_tensor(target_in[:, -1]), ops.convert_to_tensor(t, "int32"),
                                                   allow_eos, memory_kv, source_bias, caches)  # (N,), (N,)
            else:
                next_ids, chosen = step_fn(ops.convert_to_tensor(target_in), memory, source_mask, allow_eos)  # (N,), (N,)
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

    def beam_search(self, source, beam_size=4, alpha=0.6, max_len=None, min_len=0, return_scores=False):
        """Batched beam search with the GNMT length penalty ((5 + length) / 6) ** alpha.

        Each step extends the K open hypotheses of every sentence, keeps the 2K best candidates,
        moves those that end in </s> among the best K to the finished ones, and keeps the best K
        others open. A sentence stops once the best score any open hypothesis could still reach
        (its log-probability over the penalty at max_len) cannot beat its best finished one.
        With beam_size 1 and alpha 0 this is greedy decoding.

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
        n, k = int(ops.shape(source)[0]), beam_size
        max_len = self.default_max_len(int(ops.shape(source)[1])) if max_len is None else max_len
        penalty = lambda length: ((5.0 + length) / 6.0) ** alpha
        memory_kv, source_bias, caches = self.compiled_fn("start_decoding")(source, max_len, k)
        step_fn, reorder_fn = self.compiled_fn("beam_step"), self.compiled_fn("reorder_caches")

        alive_scores = np.full((n, k), -np.inf)  # (N, K) log-probabilities of the open hypotheses
        alive_scores[:, 0] = 0.0  # the K copies start as one <s>
        alive_seqs = np.zeros((n, k, 0), np.int32)  # (N, K, t)
        tokens = np.full(n * k, BOS, np.int32)  # (N*K,)
        best = [None] * n  # per sentence: (normalized score, log-probability, ids) of the best finished
        done = np.zeros(n, bool)
        rows = np.arange(n)[:, None]
        vocab = self.vocab_size
        for t in range(max_len):
            top_scores, top, caches = step_fn(
                ops.convert_to_tensor(tokens), ops.convert_to_tensor(t, "int32"), ops.convert_to_tensor(t >= min_len),
                ops.convert_to_tensor(alive_scores, "float32"), memory_kv, source_bias, caches, k)
            top_scores = ops.convert_to_numpy(top_scores).astype(np.float64)  # (N, 2K), best first
            top = ops.convert_to_numpy(top)  # (N, 2K)
            top_beams, top_tokens = top // vocab, (top % vocab).astype(np.int32)  # (N, 2K)
            is_eos = top_tokens == EOS
            # 1. finished: </s> among the best K candidates
            for i, j in zip(*np.nonzero(is_eos[:, :k] & ~done[:, None])):
                normalized = top_scores[i, j] / penalty(t + 1)
                if best[i] is None or normalized > best[i][0]:
                    best[i] = (normalized, top_scores[i, j], np.append(alive_seqs[i, top_beams[i, j]], EOS))
            # 2. open: the best K candidates that do not end in </s>
            order = np.argsort(is_eos, axis=1, kind="stable")[:, :k]  # (N, K) non-</s> first, by score
            beams = np.take_along_axis(top_beams, order, 1)  # (N, K)
            alive_scores = np.take_along_axis(top_scores, order, 1)  # (N, K)
            alive_seqs = np.concatenate([alive_seqs[rows, beams], np.take_along_axis(top_tokens, order, 1)[..., None]],
                                        axis=2)  # (N, K, t+1)
            # 3. done: no open hypothesis can beat the best finished one (log-probs only fall, the
            #    penalty peaks at max_len)
            bound = alive_scores.max(axis=1) / penalty(max_len)  # (N,)
            for i in np.nonzero(~done)[0]:
                if best[i] is not None and bound[i] <= best[i][0]:
                    done[i] = True
            alive_scores[done] = -np.inf
            if done.all():
                break
            tokens = alive_seqs[:, :, -1].reshape(-1)  # (N*K,)
            caches = reorder_fn(caches, ops.convert_to_tensor((rows * k + beams).reshape(-1), "int32"))
        results = []
        for i in range(n):
            if best[i] is None:  # nothing finished within max_len: the best open hypothesis
                j = int(np.argmax(alive_scores[i]))
                best[i] = (None, alive_scores[i, j], alive_seqs[i, j])
            results.append(best[i])
        ids = np.full((n, max(len(r[2]) for r in results)), PAD, np.int32)
        for i, (_, _, seq) in enumerate(results):
            ids[i, :len(seq)] = seq
        scores = np.array([r[1] for r in results])
        return (ids, scores) if return_scores else ids

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "d_ff": self.d_ff, "num_blocks": self.num_blocks, "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate, "maxlen1": self.maxlen1, "maxlen2": self.maxlen2,
                "positional": self.positional}

    def build_from_config(self, config):
        self.build_with_dummy()

    def get_build_config(self):
        return {"built_by": "build_with_dummy"}  # non-empty: Keras only builds on load when truthy

    def build_with_dummy(self):
        """Create every weight by calling the model once on a tiny batch."""
        dummy = np.array([[4, EOS]], np.int32)
        self((dummy, dummy), training=False)


def make_model(hp, vocab_size):
    """The Transformer of hp's settings over a vocabulary of vocab_size, built."""
    model = Transformer(vocab_size=vocab_size, d_model=hp.d_model, d_ff=hp.d_ff,
                        num_blocks=hp.num_blocks, num_heads=hp.num_heads,
                        dropout_rate=hp.dropout_rate, maxlen1=hp.maxlen1, maxlen2=hp.maxlen2,
                        positional=hp.positional, name="transformer")
    model.build_with_dummy()
    return model


def compile_model(model, hp):
    """Adam (beta1 0.9, beta2 0.98, eps 1e-9) with warmup and inverse-sqrt decay (section 5.3),
    label-smoothed cross-entropy over non-pad tokens. With hp.skip_nonfinite, updates whose
    gradients are not finite are left out (GuardedAdam)."""
    adam = GuardedAdam if hp.skip_nonfinite else keras.optimizers.Adam
    optimizer = adam(learning_rate=WarmupInverseSqrt(hp.lr, hp.warmup_steps), beta_1=0.9, beta_2=0.98,
                     epsilon=1e-9)
    model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy(hp.smoothing, pad_id=PAD))
    return model
