"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017) as Keras 3 layers, in the
paper's order: positional encoding (3.5), embeddings (3.4), scaled dot-product attention (3.2.1),
multi-head attention (3.2.2), the feed-forward network (3.3), residual connections and layer
normalization, encoder and decoder blocks (3.1), label smoothing (5.4), the learning-rate
schedule and the optimizer (5.3).

Written with `keras.ops` only, so the same code runs on the TensorFlow, JAX and PyTorch backends.
Layers take plain arguments (no hyperparameter object) and do no I/O. Masks are built once from
token ids by the model and passed by name.

fast.py holds faster drop-ins for a few parts of this file (same weights, same results within
rounding), chosen with --kernels; this file is the plain version they are tested against.

Shape letters: N batch, T1 source length, T2 target length, T any length, L cache length, h heads,
d d_model, d_k d_model/h, f d_ff, V vocabulary.
"""
import math

import keras
import numpy as np
from keras import ops

import devices

PACKAGE = "transformer"
NEG_INF = -1e9  # added to the attention logits of masked keys

# Stock Keras parts, by name: fast.py puts its drop-ins in their place (--kernels fast).
Dropout = keras.layers.Dropout
LayerNormalization = keras.layers.LayerNormalization
Adam = keras.optimizers.Adam  # section 5.3; model.compile_model builds it


# 3.5 Positional encoding

def sinusoid(length, d_model, dtype="float32", start=0):
    """Sinusoid positional encoding of positions start..start+length-1: (length, d).

    PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)): the exponent
    uses 2 * (j // 2) for dimension j, so each sin/cos pair shares one frequency.
    """
    pos = ops.cast(ops.arange(length) + start, "float32")  # (T,)
    j = np.arange(d_model)
    inv_freq = ops.convert_to_tensor(10000.0 ** (-(2 * (j // 2)) / d_model), "float32")  # (d,)
    angles = ops.expand_dims(pos, 1) * ops.expand_dims(inv_freq, 0)  # (T, d)
    even = ops.convert_to_tensor(j % 2 == 0)  # (d,)
    return ops.cast(ops.where(even, ops.sin(angles), ops.cos(angles)), dtype)  # (T, d)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to embeddings (section 3.5).

    Args:
      d_model: d.
      maxlen: longest sequence for the learned kind (the sinusoid kind takes any length).
      kind: "sinusoid" (the paper, the reference's 2019 version) or "learned" (the reference's
        legacy default, `hp.sinusoid = False`).
    """

    def __init__(self, d_model, maxlen, kind="sinusoid", **kwargs):
        super().__init__(**kwargs)
        if kind not in ("sinusoid", "learned"):
            raise ValueError(f"kind must be 'sinusoid' or 'learned', not {kind!r}")
        self.d_model, self.maxlen, self.kind = d_model, maxlen, kind

    def build(self, input_shape=None):
        if self.kind == "learned":
            self.table = self.add_weight(name="table", shape=(self.maxlen, self.d_model),
                                         initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x, start=0):
        """x (N, T, d) -> x + PE[start:start+T] (N, T, d)."""
        length = ops.shape(x)[1]
        if self.kind == "sinusoid":
            pe = sinusoid(length, self.d_model, x.dtype, start)  # (T, d)
        else:
            pe = ops.cast(ops.take(self.table, ops.arange(length) + start, axis=0), x.dtype)  # (T, d)
        return x + ops.expand_dims(pe, 0)  # (N, T, d)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "maxlen": self.maxlen,
                "kind": self.kind}


# 3.4 Embeddings and softmax

@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), with <pad> embedding to zeros (section 3.4).

    The same matrix is the pre-softmax linear layer (`project`), as in the paper; the
    reference's 2019 version shares it between source, target and output too.

    Args:
      vocab_size: V.
      d_model: d.
      pad_id: the id whose embedding is zero.
      initializer: "normal", N(0, d^-0.5), so that scaled embeddings have about the positional
        encoding's size; or "xavier", Glorot uniform, as the reference (std about 0.008 for
        32000 x 512: scaled, about 0.18 of the positional encoding).
      zero_pad_logit: the <pad> row is zero in the output projection too, so the <pad> logit is
        always 0, as in the reference (whose matrix has a constant zero row); otherwise that row
        is trained through the output projection alone.
    """

    def __init__(self, vocab_size, d_model, pad_id=0, initializer="normal", zero_pad_logit=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.pad_id = vocab_size, d_model, pad_id
        self.initializer, self.zero_pad_logit = initializer, zero_pad_logit

    def build(self, input_shape=None):
        initializer = (keras.initializers.GlorotUniform() if self.initializer == "xavier"
                       else keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        self.embeddings = self.add_weight(name="embeddings", shape=(self.vocab_size, self.d_model),
                                          initializer=initializer)

    def call(self, ids):
        """ids (N, T) int -> (N, T, d)."""
        x = ops.take(self.embeddings, ids, axis=0)  # (N, T, d)
        keep = ops.cast(ops.not_equal(ids, self.pad_id), x.dtype)  # (N, T)
        return x * ops.expand_dims(keep, -1) * math.sqrt(self.d_model)  # (N, T, d)

    def output_matrix(self, rows=None):
        """The matrix of the pre-softmax linear layer: every row (V, d), or those of the ids in
        rows (V',); the <pad> row zeroed with zero_pad_logit."""
        w = self.embeddings if rows is None else ops.take(self.embeddings, rows, axis=0)  # (V or V', d)
        if self.zero_pad_logit:
            ids = ops.arange(self.vocab_size) if rows is None else rows  # (V or V',)
            w = w * ops.expand_dims(ops.cast(ops.not_equal(ids, self.pad_id), w.dtype), -1)  # (V or V', d)
        return w

    def project(self, x, rows=None):
        """Logits: x (N, T, d) times the transposed output matrix -> (N, T, V) in float32 (the
        matmul in x's dtype). With rows (V',) int ids, only those rows of the matrix: logits
        (N, T, V') over those ids, in their order."""
        w = self.output_matrix(rows)  # (V or V', d)
        logits = ops.matmul(x, ops.transpose(ops.cast(w, x.dtype)))  # (N, T, V or V')
        return ops.cast(logits, "float32")  # (N, T, V or V')

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "pad_id": self.pad_id, "initializer": self.initializer, "zero_pad_logit": self.zero_pad_logit}


# 3.2.1 Scaled dot-product attention

def attention_bias(key_padding_mask, causal, query_length, key_length):
    """Additive float32 attention bias from masks: 0 where attending is allowed, NEG_INF where not.

    Args:
      key_padding_mask: (N, Tk) bool, True at keys that may be attended to; or None.
      causal: whether query t may only see keys <= t.

    Returns:
      (N or 1, 1, Tq or 1, Tk) tensor, or None when nothing is masked.
    """
    allowed = None
    if key_padding_mask is not None:
        allowed = ops.expand_dims(ops.expand_dims(key_padding_mask, 1), 1)  # (N, 1, 1, Tk)
    if causal:
        q = ops.expand_dims(ops.arange(query_length), 1)  # (Tq, 1)
        k = ops.expand_dims(ops.arange(key_length), 0)  # (1, Tk)
        past = ops.reshape(ops.greater_equal(q, k), (1, 1, query_length, key_length))  # (1, 1, Tq, Tk)
        allowed = past if allowed is None else ops.logical_and(allowed, past)  # (N, 1, Tq, Tk)
    if allowed is None:
        return None
    return ops.where(allowed, ops.zeros((), "float32"), ops.full((), NEG_INF, "float32"))


def attention_weights(q, k, bias=None):
    """softmax(Q K^T / sqrt(d_k) + bias): how much each query attends to each key (section 3.2.1).

    The product runs in the inputs' dtype; the scaling, the bias and the softmax in float32 (under
    mixed precision too: -1e9 does not fit float16).

    Args:
      q: (N, h, Tq, d_k) queries; k: (N, h, Tk, d_k) keys.
      bias: additive float32 mask broadcastable to (N, h, Tq, Tk), or None.

    Returns:
      (N, h, Tq, Tk) float32, each row summing to 1.
    """
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2))  # (N, h, Tq, Tk)
    scores = ops.cast(scores, "float32") / math.sqrt(q.shape[-1])  # (N, h, Tq, Tk)
    if bias is not None:
        scores = scores + bias  # (N, h, Tq, Tk)
    return ops.softmax(scores, axis=-1)  # (N, h, Tq, Tk)


def scaled_dot_product_attention(q, k, v, bias=None, dropout=None, training=None):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, for every head at once (section 3.2.1).

    Args:
      q: (N, h, Tq, d_k) queries; k, v: (N, h, Tk, d_k) keys and values.
      bias: additive float32 mask broadcastable to (N, h, Tq, Tk), or None.
      dropout: a Dropout layer for the attention weights, or None.

    Returns:
      (N, h, Tq, d_k).
    """
    weights = ops.cast(attention_weights(q, k, bias), v.dtype)  # (N, h, Tq, Tk)
    if dropout is not None:
        weights = dropout(weights, training=training)  # (N, h, Tq, Tk)
    return ops.matmul(weights, v)  # (N, h, Tq, d_k)


# 3.2.2 Multi-head attention

@keras.saving.register_keras_serializable(package=PACKAGE)
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (section 3.2.2): h heads of scaled dot-product attention over learned
    projections of queries, keys and values, concatenated and projected back to d.

    For decoding one position at a time it takes a key/value cache (as keras-hub's
    CachedMultiHeadAttention): see `call`. With `keep_attention` set (attention.py, eager calls
    only), each call keeps its attention weights (N, h, Tq, Tk) in `last_attention`, to be looked at.

    Args:
      d_model: d.
      num_heads: h; d must be divisible by h.
      dropout_rate: dropout on the attention weights.
      output_projection: the final projection W^O; without it (the reference 2019) the
        concatenated heads are the output.
    """

    def __init__(self, d_model, num_heads, dropout_rate=0.0, output_projection=True, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.d_model, self.num_heads, self.dropout_rate = d_model, num_heads, dropout_rate
        self.output_projection = output_projection
        self.d_k = d_model // num_heads
        self.query_dense = keras.layers.Dense(d_model, name="query")
        self.key_dense = keras.layers.Dense(d_model, name="key")
        self.value_dense = keras.layers.Dense(d_model, name="value")
        self.output_dense = keras.layers.Dense(d_model, name="output") if output_projection else None
        self.dropout = Dropout(dropout_rate)
        self.keep_attention, self.last_attention = False, None

    def build(self, query_shape, memory_shape=None):
        memory_shape = query_shape if memory_shape is None else memory_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(memory_shape)
        self.value_dense.build(memory_shape)
        if self.output_dense is not None:
            self.output_dense.build(query_shape[:-1] + (self.d_model,))

    def split_heads(self, x):
        """(N, T, d) -> (N, h, T, d_k)."""
        x = ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], self.num_heads, self.d_k))  # (N, T, h, d_k)
        return ops.transpose(x, (0, 2, 1, 3))  # (N, h, T, d_k)

    def combine_heads(self, x):
        """(N, h, T, d_k) -> (N, T, d)."""
        x = ops.transpose(x, (0, 2, 1, 3))  # (N, T, h, d_k)
        return ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], self.d_model))  # (N, T, d)

    def output(self, heads):
        """Attention output of every head (N, h, T, d_k): concatenated, projected by W^O -> (N, T, d)."""
        x = self.combine_heads(heads)  # (N, T, d)
        return x if self.output_dense is None else self.output_dense(x)  # (N, T, d)

    def keys_values(self, memory):
        """Keys and values of memory (N, Tk, d), split into heads: a pair of (N, h, Tk, d_k). For
        decoding, a cross-attention cache is this, computed once from the encoder output."""
        return self.split_heads(self.key_dense(memory)), self.split_heads(self.value_dense(memory))

    def call(self, query, memory, key_padding_mask=None, causal=False, cache=None, cache_index=None,
             training=None):
        """Attend from query to memory.

        Args:
          query: (N, Tq, d).
          memory: (N, Tk, d): the query itself for self-attention, the encoder output otherwise.
          key_padding_mask: (N or 1, Tk) bool, True at keys that may be attended to.
          causal: mask keys after each query position.
          cache: for decoding, (keys, values), each (N, h, L, d_k). With cache_index
            (self-attention), the query's own keys/values are written at positions cache_index..
            and the query attends over the whole cache (key_padding_mask says which entries are
            filled); without (cross-attention), the cache is `keys_values(memory)`, and memory is
            not read.

        Returns:
          (N, Tq, d), or with a cache ((N, Tq, d), the cache).
        """
        # 1. project the queries, keys and values, and split them into heads
        q = self.split_heads(self.query_dense(query))  # (N, h, Tq, d_k)
        if cache is None:
            k, v = self.keys_values(memory)  # (N, h, Tk, d_k) each
        elif cache_index is not None:
            start = (0, 0, cache_index, 0)
            k_new, v_new = self.keys_values(query)  # (N, h, Tq, d_k) each
            k = ops.slice_update(cache[0], start, ops.cast(k_new, cache[0].dtype))  # (N, h, L, d_k)
            v = ops.slice_update(cache[1], start, ops.cast(v_new, cache[1].dtype))  # (N, h, L, d_k)
            cache = (k, v)
        else:
            k, v = cache  # (N, h, Tk, d_k) each
        # 2. the masks as one additive bias
        bias = attention_bias(key_padding_mask, causal, ops.shape(q)[2], ops.shape(k)[2])
        # 3. attend in every head, concatenate the heads, project
        heads = scaled_dot_product_attention(q, k, v, bias, self.dropout, training)  # (N, h, Tq, d_k)
        if self.keep_attention:
            self.last_attention = attention_weights(q, k, bias)  # (N, h, Tq, Tk)
        out = self.output(heads)  # (N, Tq, d)
        return out if cache is None else (out, cache)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate, "output_projection": self.output_projection}


# 3.3 Position-wise feed-forward network

@keras.saving.register_keras_serializable(package=PACKAGE)
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 at every position (section 3.3): "two convolutions
    with kernel size 1", as the paper says and the reference builds it.

    Args:
      d_model: d.
      d_ff: f, the inner width.
    """

    def __init__(self, d_model, d_ff, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff = d_model, d_ff
        self.inner = keras.layers.Conv1D(d_ff, 1, activation="relu", name="inner")
        self.outer = keras.layers.Conv1D(d_model, 1, name="outer")

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build(input_shape[:-1] + (self.d_ff,))

    def call(self, x):
        """x (N, T, d) -> (N, T, d)."""
        h = self.inner(x)  # (N, T, f)
        return self.outer(h)  # (N, T, d)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff}


# 3.1 Residual connection and layer normalization around every sublayer

@keras.saving.register_keras_serializable(package=PACKAGE)
class AddNorm(keras.layers.Layer):
    """LayerNorm(x + Dropout(Sublayer(x))) (sections 3.1 and 5.4).

    Args:
      dropout_rate: residual dropout on the sublayer's output.
      epsilon: layer-norm epsilon.
    """

    def __init__(self, dropout_rate=0.0, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout_rate, self.epsilon = dropout_rate, epsilon
        self.dropout = Dropout(dropout_rate)
        self.norm = LayerNormalization(epsilon=epsilon, name="norm")

    def build(self, x_shape, y_shape=None):
        self.norm.build(x_shape)

    def call(self, x, y, training=None):
        """x (N, T, d) residual, y (N, T, d) sublayer output -> (N, T, d)."""
        return self.norm(x + self.dropout(y, training=training))  # (N, T, d)

    def get_config(self):
        return {**super().get_config(), "dropout_rate": self.dropout_rate, "epsilon": self.epsilon}


# 3.1 Encoder and decoder blocks

@keras.saving.register_keras_serializable(package=PACKAGE)
class EncoderBlock(keras.layers.Layer):
    """Self-attention and feed-forward, each wrapped in AddNorm (section 3.1, encoder).

    Args:
      d_model, d_ff, num_heads: d, f, h.
      dropout_rate: on the attention weights and, with residual_dropout, on each sublayer's output.
      output_projection: W^O in the attention (MultiHeadAttention).
      residual_dropout: dropout on each sublayer's output before the residual sum (section 5.4).
      epsilon: layer-norm epsilon.
      attention_dropout: the attention weights' own rate instead of dropout_rate (None: dropout_rate).
    """

    def __init__(self, d_model, d_ff, num_heads, dropout_rate=0.0, output_projection=True,
                 residual_dropout=True, epsilon=1e-6, attention_dropout=None, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff, self.num_heads, self.dropout_rate = d_model, d_ff, num_heads, dropout_rate
        self.output_projection, self.residual_dropout, self.epsilon = output_projection, residual_dropout, epsilon
        self.attention_dropout = attention_dropout
        residual = dropout_rate if residual_dropout else 0.0
        attention_rate = dropout_rate if attention_dropout is None else attention_dropout
        self.self_attention = MultiHeadAttention(d_model, num_heads, attention_rate, output_projection,
                                                 name="self_attention")
        self.self_attention_norm = AddNorm(residual, epsilon, name="self_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, name="feed_forward")
        self.feed_forward_norm = AddNorm(residual, epsilon, name="feed_forward_norm")

    def build(self, x_shape):
        for layer in (self.self_attention, self.self_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(x_shape)

    def call(self, x, padding_mask, training=None):
        """x (N, T1, d), padding_mask (N, T1) bool, True at real tokens -> (N, T1, d)."""
        a = self.self_attention(x, x, key_padding_mask=padding_mask, training=training)  # (N, T1, d)
        x = self.self_attention_norm(x, a, training=training)  # (N, T1, d)
        f = self.feed_forward(x)  # (N, T1, d)
        return self.feed_forward_norm(x, f, training=training)  # (N, T1, d)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "num_heads": self.num_heads, "dropout_rate": self.dropout_rate,
                "output_projection": self.output_projection, "residual_dropout": self.residual_dropout,
                "epsilon": self.epsilon, "attention_dropout": self.attention_dropout}


@keras.saving.register_keras_serializable(package=PACKAGE)
class DecoderBlock(keras.layers.Layer):
    """Causal self-attention, attention over the encoder output, feed-forward, each wrapped in
    AddNorm (section 3.1, decoder). Arguments as EncoderBlock's."""

    def __init__(self, d_model, d_ff, num_heads, dropout_rate=0.0, output_projection=True,
                 residual_dropout=True, epsilon=1e-6, attention_dropout=None, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff, self.num_heads, self.dropout_rate = d_model, d_ff, num_heads, dropout_rate
        self.output_projection, self.residual_dropout, self.epsilon = output_projection, residual_dropout, epsilon
        self.attention_dropout = attention_dropout
        residual = dropout_rate if residual_dropout else 0.0
        attention_rate = dropout_rate if attention_dropout is None else attention_dropout
        self.self_attention = MultiHeadAttention(d_model, num_heads, attention_rate, output_projection,
                                                 name="self_attention")
        self.self_attention_norm = AddNorm(residual, epsilon, name="self_attention_norm")
        self.cross_attention = MultiHeadAttention(d_model, num_heads, attention_rate, output_projection,
                                                  name="cross_attention")
        self.cross_attention_norm = AddNorm(residual, epsilon, name="cross_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, name="feed_forward")
        self.feed_forward_norm = AddNorm(residual, epsilon, name="feed_forward_norm")

    def build(self, x_shape, memory_shape=None):
        memory_shape = x_shape if memory_shape is None else memory_shape
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        for layer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(x_shape)

    def call(self, x, memory, target_mask, source_mask, training=None, self_cache=None,
             cross_cache=None, step=None):
        """Decoder block.

        Args:
          x: (N, T2, d) decoder states.
          memory: (N, T1, d) encoder output (not read when decoding with caches).
          target_mask: (N or 1, T2) bool, True at real target tokens (with caches: (1, L), True at
            the filled cache entries).
          source_mask: (N, T1) bool, True at real source tokens.
          self_cache, cross_cache, step: for decoding position `step` alone (x (N, 1, d)): the
            self-attention cache (keys, values), each (N, h, L, d_k), whose entry `step` this call
            writes, and the encoder output's keys/values, each (N, h, T1, d_k) (see
            MultiHeadAttention.call).

        Returns:
          (N, T2, d), or with caches ((N, 1, d), the updated self-attention cache).
        """
        if self_cache is None:  # training, or the reference's uncached decoding: all positions
            a = self.self_attention(x, x, key_padding_mask=target_mask, causal=True,
                                    training=training)  # (N, T2, d)
        else:  # one new position: earlier ones are in the cache, later ones do not exist yet
            a, self_cache = self.self_attention(x, x, key_padding_mask=target_mask, cache=self_cache,
                                                cache_index=step)  # (N, 1, d)
        x = self.self_attention_norm(x, a, training=training)  # (N, T2, d)
        c = self.cross_attention(x, memory, key_padding_mask=source_mask, cache=cross_cache,
                                 training=training)  # (N, T2, d)
        c = c if cross_cache is None else c[0]  # (N, T2, d)
        x = self.cross_attention_norm(x, c, training=training)  # (N, T2, d)
        f = self.feed_forward(x)  # (N, T2, d)
        x = self.feed_forward_norm(x, f, training=training)  # (N, T2, d)
        return x if self_cache is None else (x, self_cache)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "num_heads": self.num_heads, "dropout_rate": self.dropout_rate,
                "output_projection": self.output_projection, "residual_dropout": self.residual_dropout,
                "epsilon": self.epsilon, "attention_dropout": self.attention_dropout}


# 5.4 Label smoothing, and the loss

def label_smoothing(inputs, epsilon=0.1):
    """Smooth one-hot targets: (1 - epsilon) * inputs + epsilon / V (section 5.4).

    inputs (..., V) one-hot -> (..., V). With V = 3 and epsilon 0.1: 0.9333 and 0.0333.
    """
    v = ops.shape(inputs)[-1]
    return (1.0 - epsilon) * inputs + epsilon / v


def smoothed_cross_entropy(logits, labels, epsilon):
    """Cross-entropy of the softmax of logits against label_smoothing(one_hot(labels), epsilon),
    per token: logits (N, T, V) float32, labels (N, T) int32 -> (N, T).

    The smoothed target puts 1 - eps + eps/V on the label and eps/V elsewhere, so the sum over V
    splits into -(1 - eps) log p(label) - eps mean_v log p(v): no (N, T, V) target is built.
    """
    log_probs = ops.log_softmax(logits, axis=-1)  # (N, T, V)
    at_label = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1)[..., 0]  # (N, T)
    return -(1.0 - epsilon) * at_label - epsilon * ops.mean(log_probs, axis=-1)  # (N, T)


@keras.saving.register_keras_serializable(package=PACKAGE)
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, averaged over the non-pad target tokens.

    Args:
      epsilon: smoothing rate.
      pad_id: label id that does not count.
      label_map: for logits over a part of the vocabulary (the model's output_ids), each id's
        column (V,) ints; None: logits over every id. pad_id must map to itself.
    """

    def __init__(self, epsilon=0.1, pad_id=0, label_map=None, name="label_smoothed_cross_entropy", **kwargs):
        super().__init__(name=name, reduction="sum_over_batch_size", **kwargs)
        self.epsilon, self.pad_id = epsilon, pad_id
        self.label_map = None if label_map is None else [int(i) for i in label_map]

    def call(self, labels, logits):
        """labels (N, T2) int, logits (N, T2, V) -> per-token loss (N, T2), scaled so that Keras'
        reduction (sum / (N * T2)) gives the mean over the real tokens.

        With data parallelism each replica holds a part of the batch; it divides by the mean of
        the replicas' token counts (devices.mean_over_replicas), so that every token of the whole
        batch weighs the same however unevenly they are split."""
        labels = ops.cast(labels, "int32")  # (N, T2)
        if self.label_map is not None:
            labels = ops.take(ops.convert_to_tensor(np.asarray(self.label_map, np.int32)), labels)  # (N, T2) columns
        per_token = smoothed_cross_entropy(ops.cast(logits, "float32"), labels, self.epsilon)  # (N, T2)
        mask = ops.cast(ops.not_equal(labels, self.pad_id), "float32")  # (N, T2)
        size = ops.cast(ops.shape(mask)[0] * ops.shape(mask)[1], "float32")
        tokens = devices.mean_over_replicas(ops.sum(mask))  # real tokens
        return per_token * mask * (size / ops.maximum(tokens, 1.0))  # (N, T2)

    def get_config(self):
        return {"name": self.name, "epsilon": self.epsilon, "pad_id": self.pad_id, "label_map": self.label_map}


# 5.3 Optimizer: Adam (beta1 0.9, beta2 0.98, eps 1e-9, model.compile_model) with this schedule

@keras.saving.register_keras_serializable(package=PACKAGE)
class WarmupInverseSqrt(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak_lr` over `warmup_steps`, then decay as 1/sqrt(step) (section 5.3).

    The reference's `noam_scheme(init_lr, step, warmup)`: peak_lr * min(step / warmup,
    sqrt(warmup / step)), with step counted from 1.
    """

    def __init__(self, peak_lr, warmup_steps):
        self.peak_lr, self.warmup_steps = peak_lr, warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = float(max(self.warmup_steps, 1))
        return self.peak_lr * ops.minimum(step / warmup, ops.sqrt(warmup / step))

    def get_config(self):
        return {"peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package=PACKAGE)
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to `peak_lr` over `warmup_steps`, then a straight line down to 0 at `total_steps`.

    Not in the reference: a run of a known length ends at a learning rate of 0 instead of the
    inverse-sqrt schedule's peak_lr * sqrt(warmup / total). Step counted from 1, as above.
    """

    def __init__(self, peak_lr, warmup_steps, total_steps):
        self.peak_lr, self.warmup_steps, self.total_steps = peak_lr, warmup_steps, total_steps

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = float(max(self.warmup_steps, 1))
        decay = float(max(self.total_steps - self.warmup_steps, 1))
        rise = step / warmup
        fall = (float(self.total_steps) - step) / decay
        return self.peak_lr * ops.maximum(ops.minimum(rise, fall), 0.0)

    def get_config(self):
        return {"peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}
