"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017) as Keras 3 layers, in the
paper's order: positional encoding (3.5), embeddings (3.4), scaled dot-product attention (3.2.1),
multi-head attention (3.2.2), the feed-forward network (3.3), residual connections and layer
normalization, encoder and decoder blocks (3.1), label smoothing (5.4), the learning-rate
schedule and the optimizer (5.3).

Written with `keras.ops` only, so the same code runs on the TensorFlow, JAX and PyTorch backends.
Layers take plain arguments (no hyperparameter object; Choices takes its defaults from
hyperparams.Hparams) and do no I/O. Masks are built once from
token ids by the model and passed by name.

The layers are built from a few primitives, `Parts` (first below): a kernel-size-1 convolution,
dropout, layer normalization, the loss, decoding's cache and its writes. Each layer takes the
parts it is built with, plain by default; kernels/fast.py has faster kernels for some of them, with
the same weights and results, which the model hands to its layers when --kernels asks for them (and
the cache and the writes, as the decoding loops are compiled). Every forward pass, plain or fast,
training or decoding, runs the `call` methods written here.

Shape letters: N batch, T1 source length, T2 target length, T any length, L cache length, h heads,
d d_model, d_k d_model/h, f d_ff, V vocabulary.
"""
import dataclasses
import math
from typing import Callable, Optional

import keras
import numpy as np
from keras import ops

import hyperparams
from hyperparams import NORMS as NORM_PLACES
from hyperparams import POSITIONAL as POSITIONAL_KINDS

PACKAGE = "transformer"
NEG_INF = -1e9  # added to the attention logits of masked keys


# The parts every layer below is built from

class PointwiseConv(keras.layers.Conv1D):
    """A convolution with kernel size 1 (section 3.3): the same linear map, and activation, applied
    to each position alone: x (N, T, in) -> (N, T, filters). Its kernel is (1, in, filters)."""

    def __init__(self, filters, activation=None, kernel_size=1, **kwargs):
        if kernel_size not in (1, (1,), [1]):
            raise ValueError(f"a pointwise convolution has kernel size 1, not {kernel_size}")
        super().__init__(filters, 1, activation=activation, **kwargs)


class FixedLengthCache:
    """Decoding's self-attention cache of keys (or values) as the plain model keeps it: L empty
    entries from the start, each step's written at its entry, the entries not yet written masked
    (decode_step's target_mask). Its shape never changes: what XLA and JAX compile."""

    @staticmethod
    def empty(rows, num_heads, length, d_k, dtype):
        """The cache before the first step: (rows, h, L, d_k) zeros."""
        return ops.zeros((rows, num_heads, length, d_k), dtype)

    @staticmethod
    def write(cache, index, new):
        """cache (N, h, L, d_k) with new (N, h, G, d_k) written at entries index..index+G-1."""
        return ops.slice_update(cache, (0, 0, index, 0), new)  # (N, h, L, d_k)

    @staticmethod
    def entries(cache, written):
        """The entries the cache holds once a step has written `written` more: L."""
        return ops.shape(cache)[2]


@dataclasses.dataclass(frozen=True)
class Parts:
    """The primitives the layers are built from: the plain ones by default. kernels/fast.py builds a Parts
    with faster kernels for some (same weights, same results within rounding); the model hands
    its Parts to every layer when it is built (--kernels)."""

    Dense: type = keras.layers.Dense  # a learned linear map of the last axis (3.2.2's projections)
    matmul_transposed: Callable = None  # x times a weight matrix transposed (3.4's logits); None: matmul_transposed
    Pointwise: type = PointwiseConv  # a kernel-size-1 convolution (3.3)
    Dropout: type = keras.layers.Dropout  # (5.4)
    LayerNormalization: type = keras.layers.LayerNormalization  # (3.1)
    cross_entropy: Optional[Callable] = None  # the loss per token (5.4); None: smoothed_cross_entropy
    cache: type = FixedLengthCache  # decoding's self-attention cache: its entries, and a step's write
    slice_update: Callable = ops.slice_update  # decoding's write of a step into its outputs


PLAIN = Parts()


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
      kind: "sinusoid" (the paper, the reference's 2019 version), "learned" (the reference's
        legacy default, `hp.sinusoid = False`) or "none" (nothing added: the model sees no order
        but what the decoder's causal mask gives it).
    """

    def __init__(self, d_model, maxlen, kind="sinusoid", **kwargs):
        super().__init__(**kwargs)
        if kind not in POSITIONAL_KINDS:
            raise ValueError(f"kind must be 'sinusoid', 'learned' or 'none', not {kind!r}")
        self.d_model, self.maxlen, self.kind = d_model, maxlen, kind

    def build(self, input_shape=None):
        if self.kind == "learned":
            self.table = self.add_weight(name="table", shape=(self.maxlen, self.d_model),
                                         initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x, start=0):
        """x (N, T, d) -> x + PE[start:start+T] (N, T, d)."""
        if self.kind == "none":
            return x  # (N, T, d)
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

def matmul_transposed(a, b):
    """a @ b^T over the last two axes: a (..., M, K), b (..., N, K) or (N, K) -> (..., M, N).

    The output logits (x times the embedding matrix, transposed) and the attention logits (Q K^T,
    section 3.2.1) are both this product."""
    return ops.matmul(a, ops.swapaxes(b, -1, -2))  # (..., M, N)


@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), with <pad> embedding to zeros (section 3.4).

    The same matrix is the pre-softmax linear layer (`project`), as in the paper; the
    reference's 2019 version shares it between source, target and output too (its legacy code
    has a matrix for each: tied_output False here, and another TokenEmbedding for the source).

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
      scale: multiply the embeddings by sqrt(d_model) (section 3.4); without, they enter the
        model as they are.
      tied_output: the pre-softmax linear layer is this matrix (section 3.4); otherwise it has a
        matrix of its own (`output_embeddings`), of the same shape and initializer.
      parts: the primitives to build with (Parts; default: the plain ones).
    """

    def __init__(self, vocab_size, d_model, pad_id=0, initializer="normal", zero_pad_logit=False, scale=True,
                 tied_output=True, parts=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.pad_id = vocab_size, d_model, pad_id
        self.initializer, self.zero_pad_logit = initializer, zero_pad_logit
        self.scale, self.tied_output = scale, tied_output
        self.matmul_transposed = (parts or PLAIN).matmul_transposed or matmul_transposed

    def build(self, input_shape=None):
        def initializer():
            return (keras.initializers.GlorotUniform() if self.initializer == "xavier"
                    else keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        self.embeddings = self.add_weight(name="embeddings", shape=(self.vocab_size, self.d_model),
                                          initializer=initializer())
        if not self.tied_output:
            self.output_embeddings = self.add_weight(name="output", shape=(self.vocab_size, self.d_model),
                                                     initializer=initializer())

    def call(self, ids):
        """ids (N, T) int -> (N, T, d)."""
        x = ops.take(self.embeddings, ids, axis=0)  # (N, T, d)
        keep = ops.cast(ops.not_equal(ids, self.pad_id), x.dtype)  # (N, T)
        x = x * ops.expand_dims(keep, -1)  # (N, T, d)
        return x * math.sqrt(self.d_model) if self.scale else x  # (N, T, d)

    def output_matrix(self, rows=None):
        """The matrix of the pre-softmax linear layer: every row (V, d), or those of the ids in
        rows (V',); the <pad> row zeroed with zero_pad_logit."""
        w = self.embeddings if self.tied_output else self.output_embeddings  # (V, d)
        w = w if rows is None else ops.take(w, rows, axis=0)  # (V or V', d)
        if self.zero_pad_logit:
            ids = ops.arange(self.vocab_size) if rows is None else rows  # (V or V',)
            w = w * ops.expand_dims(ops.cast(ops.not_equal(ids, self.pad_id), w.dtype), -1)  # (V or V', d)
        return w

    def project(self, x, rows=None, matrix=None):
        """Logits: x (N, T, d) times the transposed output matrix -> (N, T, V) in float32 (the
        matmul in x's dtype). With rows (V',) int ids, only those rows of the matrix: logits
        (N, T, V') over those ids, in their order. matrix: output_matrix(rows), where the caller
        took it already (decoding takes it once for all its steps)."""
        w = self.output_matrix(rows) if matrix is None else matrix  # (V or V', d)
        logits = self.matmul_transposed(x, ops.cast(w, x.dtype))  # (N, T, V or V')
        return ops.cast(logits, "float32")  # (N, T, V or V')

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "pad_id": self.pad_id, "initializer": self.initializer, "zero_pad_logit": self.zero_pad_logit,
                "scale": self.scale, "tied_output": self.tied_output}


# 3.2.1 Scaled dot-product attention

def attention_bias(attention_mask, causal, query_length, key_length):
    """Additive float32 attention bias from masks: 0 where attending is allowed, NEG_INF where not.

    Args:
      attention_mask: (N, Tk) bool, True at keys that every query may attend to (padding masks);
        or (N, Tq, Tk), one row of keys per query; or None.
      causal: whether query t may only see keys <= t.

    Returns:
      (N or 1, 1, Tq or 1, Tk) tensor, or None when nothing is masked.
    """
    allowed = None
    if attention_mask is not None:
        if len(attention_mask.shape) == 2:  # the same keys for every query
            attention_mask = ops.expand_dims(attention_mask, 1)  # (N, 1, Tk)
        allowed = ops.expand_dims(attention_mask, 1)  # (N, 1, Tq or 1, Tk)
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
    scores = matmul_transposed(q, k)  # (N, h, Tq, Tk)
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
      (N, h, Tq, d_k) outputs, and the attention weights (N, h, Tq, Tk) float32 (before dropout).
    """
    weights = attention_weights(q, k, bias)  # (N, h, Tq, Tk)
    dropped = ops.cast(weights, v.dtype)  # (N, h, Tq, Tk)
    if dropout is not None:
        dropped = dropout(dropped, training=training)  # (N, h, Tq, Tk)
    return ops.matmul(dropped, v), weights  # (N, h, Tq, d_k), (N, h, Tq, Tk)


# 3.2.2 Multi-head attention

@keras.saving.register_keras_serializable(package=PACKAGE)
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (section 3.2.2): h heads of scaled dot-product attention over learned
    projections of queries, keys and values, concatenated and projected back to d.

    For decoding one position at a time it takes a key/value cache (as keras-hub's
    CachedMultiHeadAttention): see `call`.

    Args:
      d_model: d.
      num_heads: h; d must be divisible by h.
      dropout_rate: dropout on the attention weights.
      output_projection: the final projection W^O; without it (the reference 2019) the
        concatenated heads are the output.
      parts: the primitives to build with (Parts; default: the plain ones).
    """

    def __init__(self, d_model, num_heads, dropout_rate=0.0, output_projection=True, parts=None, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.d_model, self.num_heads, self.dropout_rate = d_model, num_heads, dropout_rate
        self.output_projection = output_projection
        self.d_k = d_model // num_heads
        parts = parts or PLAIN
        self.query_dense = parts.Dense(d_model, name="query")
        self.key_dense = parts.Dense(d_model, name="key")
        self.value_dense = parts.Dense(d_model, name="value")
        self.output_dense = parts.Dense(d_model, name="output") if output_projection else None
        self.dropout = parts.Dropout(dropout_rate)
        self.cache = parts.cache

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

    def call(self, query, memory, attention_mask=None, causal=False, cache=None, cache_index=None,
             training=None, return_attention_scores=False):
        """Attend from query to memory.

        Args:
          query: (N, Tq, d).
          memory: (N, Tk, d): the query itself for self-attention, the encoder output otherwise.
          attention_mask: (N or 1, Tk) bool, True at keys that may be attended to; or (N, Tq, Tk),
            the keys each query may attend to.
          causal: mask keys after each query position.
          cache: for decoding, (keys, values), each (N, h, L, d_k). With cache_index
            (self-attention), the query's own Tq keys/values are written at entries
            cache_index..cache_index+Tq-1 (as the cache's layout writes them, Parts.cache) and the
            query attends over the whole cache (attention_mask says which entries it may see);
            without (cross-attention), the cache
            is `keys_values(memory)`, and memory is not read.
          cache_index: a cache entry, not a position. Beam search's in-place layout writes
            hypothesis k of step t at entry t*K + k, or one entry at the first step and the others
            after it (decoding.InPlaceBeamCache). Attention made
            to depend on positions (relative, rotary) must be given them, not read them from
            here: tests/test_decoding.py decodes with every cache layout and fails when they differ.
          return_attention_scores: also return the attention weights (N, h, Tq, Tk), as Keras'
            MultiHeadAttention does (attention.py draws them).

        Returns:
          (N, Tq, d); with a cache, ((N, Tq, d), the cache); with return_attention_scores, the
          weights after those.
        """
        # 1. project the queries, keys and values, and split them into heads
        q = self.split_heads(self.query_dense(query))  # (N, h, Tq, d_k)
        if cache is None:
            k, v = self.keys_values(memory)  # (N, h, Tk, d_k) each
        elif cache_index is not None:
            k_new, v_new = self.keys_values(query)  # (N, h, Tq, d_k) each
            k = self.cache.write(cache[0], cache_index, ops.cast(k_new, cache[0].dtype))  # (N, h, L, d_k)
            v = self.cache.write(cache[1], cache_index, ops.cast(v_new, cache[1].dtype))  # (N, h, L, d_k)
            cache = (k, v)
        else:
            k, v = cache  # (N, h, Tk, d_k) each
        # 2. the masks as one additive bias
        bias = attention_bias(attention_mask, causal, ops.shape(q)[2], ops.shape(k)[2])
        # 3. attend in every head, concatenate the heads, project
        heads, weights = scaled_dot_product_attention(q, k, v, bias, self.dropout, training)  # (N, h, Tq, d_k)
        out = self.output(heads)  # (N, Tq, d)
        returned = (out,) + (() if cache is None else (cache,)) + ((weights,) if return_attention_scores else ())
        return returned[0] if len(returned) == 1 else returned

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate, "output_projection": self.output_projection}


# 3.3 Position-wise feed-forward network

@keras.saving.register_keras_serializable(package=PACKAGE)
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 at every position (section 3.3): "two convolutions
    with kernel size 1", as the paper says and the reference's legacy code builds it (its 2019
    version uses dense layers: the same map, the same weights).

    Args:
      d_model: d.
      d_ff: f, the inner width.
      parts: the primitives to build with (Parts; default: the plain ones).
    """

    def __init__(self, d_model, d_ff, parts=None, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff = d_model, d_ff
        parts = parts or PLAIN
        self.inner = parts.Pointwise(d_ff, activation="relu", name="inner")
        self.outer = parts.Pointwise(d_model, name="outer")

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build(input_shape[:-1] + (self.d_ff,))

    def call(self, x):
        """x (N, T, d) -> (N, T, d)."""
        hidden = self.inner(x)  # (N, T, f) max(0, x W1 + b1)
        return self.outer(hidden)  # (N, T, d) hidden W2 + b2

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff}


# 3.1 Residual connection and layer normalization around every sublayer

@keras.saving.register_keras_serializable(package=PACKAGE)
class AddNorm(keras.layers.Layer):
    """The residual connection around a sublayer and its layer normalization (sections 3.1, 5.4),
    in one call: LayerNorm(x + Dropout(Sublayer(x))), the paper's "post" place for the norm; or
    "pre", most later work's: x + Dropout(Sublayer(LayerNorm(x))), the residual path left
    unnormalized (the model then normalizes each stack's output once, at its end).

    A block calls it on x and the sublayer itself, as a function (as the Annotated Transformer's
    SublayerConnection): the norm's place decides what the sublayer reads, so "Add & Norm" is one
    call in the block, whichever the place.

    Args:
      dropout_rate: residual dropout on the sublayer's output.
      epsilon: layer-norm epsilon.
      position: "post" or "pre", where the layer norm sits (NORM_PLACES).
      parts: the primitives to build with (Parts; default: the plain ones).
    """

    def __init__(self, dropout_rate=0.0, epsilon=1e-6, position="post", parts=None, **kwargs):
        super().__init__(**kwargs)
        if position not in NORM_PLACES:
            raise ValueError(f"position must be 'post' or 'pre', not {position!r}")
        self.dropout_rate, self.epsilon, self.position = dropout_rate, epsilon, position
        parts = parts or PLAIN
        self.dropout = parts.Dropout(dropout_rate)
        self.norm = parts.LayerNormalization(epsilon=epsilon, name="norm")

    def build(self, x_shape):
        self.norm.build(x_shape)

    def call(self, x, sublayer, training=None):
        """x (N, T, d), sublayer a function of (N, T, d) that returns its output (N, T, d), or a
        tuple led by it -> (N, T, d); after it, with a tuple, the sublayer's other results."""
        out = sublayer(self.norm(x) if self.position == "pre" else x)  # (N, T, d), or a tuple led by it
        y, rest = (out[0], tuple(out[1:])) if isinstance(out, tuple) else (out, ())
        x = x + self.dropout(y, training=training)  # (N, T, d)
        x = x if self.position == "pre" else self.norm(x)  # (N, T, d)
        return (x, *rest) if rest else x

    def get_config(self):
        return {**super().get_config(), "dropout_rate": self.dropout_rate, "epsilon": self.epsilon,
                "position": self.position}


# 3.1 Encoder and decoder blocks

DEFAULT = hyperparams.Hparams()  # the settings' defaults: the values of the choices below when none are given


@dataclasses.dataclass(frozen=True)
class Choices:
    """Details where the paper and the reference differ, as one record that the model hands to its
    embedding and to every block (the hyperparams.Hparams fields of the same names, and their defaults)."""

    attention_output: bool = DEFAULT.attention_output  # W^O in every attention (3.2.2); the reference 2019 has none
    residual_dropout: bool = DEFAULT.residual_dropout  # dropout on each sublayer's output before the residual sum
    layer_norm_epsilon: float = DEFAULT.layer_norm_epsilon  # the reference: 1e-8
    embedding_init: str = DEFAULT.embedding_init  # TokenEmbedding's initializer; the reference: "xavier"
    pad_logit: str = DEFAULT.pad_logit  # "zero": the <pad> row of the output projection is 0, as the reference's
    norm: str = DEFAULT.norm  # where each sublayer's layer norm sits (AddNorm, NORM_PLACES)
    scale_embeddings: bool = DEFAULT.scale_embeddings  # embeddings times sqrt(d_model) (3.4)
    share_embeddings: bool = DEFAULT.share_embeddings  # one matrix for source, target and output (3.4); else three

    @classmethod
    def of(cls, value):
        """Choices from Choices, a dict (a saved config) or None (the defaults)."""
        return value if isinstance(value, cls) else cls(**(value or {}))


class Block(keras.layers.Layer):
    """What encoder and decoder blocks share: a self-attention, (in the decoder) an attention over
    the encoder output, and a feed-forward network, each wrapped in AddNorm; and their settings.

    Args:
      d_model, d_ff, num_heads: d, f, h.
      dropout_rate: on the attention weights and, with choices.residual_dropout, on each sublayer's output.
      attention_dropout: the attention weights' own rate instead of dropout_rate (None: dropout_rate).
      choices: Choices (or its dict): W^O, residual dropout, layer-norm epsilon and place.
      parts: the primitives to build with (Parts; default: the plain ones).
    """

    SUBLAYERS = ("self_attention", "feed_forward")  # in order; the decoder's has its cross_attention too

    def __init__(self, d_model, d_ff, num_heads, dropout_rate=0.0, attention_dropout=None, choices=None,
                 parts=None, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff, self.num_heads, self.dropout_rate = d_model, d_ff, num_heads, dropout_rate
        self.attention_dropout, self.choices, self.parts = attention_dropout, Choices.of(choices), parts or PLAIN
        self.self_attention = self.attention("self_attention")
        self.self_attention_norm = self.add_norm("self_attention_norm")
        if "cross_attention" in self.SUBLAYERS:
            self.cross_attention = self.attention("cross_attention")
            self.cross_attention_norm = self.add_norm("cross_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, self.parts, name="feed_forward")
        self.feed_forward_norm = self.add_norm("feed_forward_norm")

    def attention(self, name):
        """A MultiHeadAttention sublayer of this block's settings."""
        rate = self.dropout_rate if self.attention_dropout is None else self.attention_dropout
        return MultiHeadAttention(self.d_model, self.num_heads, rate, self.choices.attention_output, self.parts,
                                  name=name)

    def add_norm(self, name):
        """An AddNorm around a sublayer, with residual dropout unless the choices turn it off."""
        rate = self.dropout_rate if self.choices.residual_dropout else 0.0
        return AddNorm(rate, self.choices.layer_norm_epsilon, self.choices.norm, self.parts, name=name)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "num_heads": self.num_heads, "dropout_rate": self.dropout_rate,
                "attention_dropout": self.attention_dropout, "choices": dataclasses.asdict(self.choices)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class EncoderBlock(Block):
    """Self-attention and feed-forward, each wrapped in AddNorm (section 3.1, encoder). Arguments
    as Block's."""

    def build(self, x_shape):
        for layer in (self.self_attention, self.self_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(x_shape)

    def call(self, x, padding_mask, training=None, return_attention_scores=False):
        """x (N, T1, d), padding_mask (N, T1) bool, True at real tokens -> (N, T1, d); with
        return_attention_scores also the self-attention weights (N, h, T1, T1)."""
        x, weights = self.self_attention_norm(x, sublayer=lambda x: self.self_attention(
            x, x, attention_mask=padding_mask, training=training, return_attention_scores=True),
            training=training)  # (N, T1, d)
        x = self.feed_forward_norm(x, sublayer=self.feed_forward, training=training)  # (N, T1, d)
        return (x, weights) if return_attention_scores else x


@keras.saving.register_keras_serializable(package=PACKAGE)
class DecoderBlock(Block):
    """Causal self-attention, attention over the encoder output, feed-forward, each wrapped in
    AddNorm (section 3.1, decoder). Arguments as Block's."""

    SUBLAYERS = ("self_attention", "cross_attention", "feed_forward")

    def build(self, x_shape, memory_shape=None):
        memory_shape = x_shape if memory_shape is None else memory_shape
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        for layer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(x_shape)

    def call(self, x, memory, target_mask, source_mask, training=None, self_cache=None,
             cross_cache=None, cache_index=None, return_attention_scores=False):
        """Decoder block.

        Args:
          x: (N, T2, d) decoder states.
          memory: (N, T1, d) encoder output (not read when decoding with caches).
          target_mask: (N or 1, T2) bool, True at real target tokens (with caches: True at the
            cache entries x may see, (1, L) or per query (N, T2, L)).
          source_mask: (N, T1) bool, True at real source tokens.
          self_cache, cross_cache, cache_index: for decoding (x the new positions only): the
            self-attention cache (keys, values), each (N, h, L, d_k), whose entries from
            cache_index (an entry, not a position) on this call writes, and the encoder output's
            keys/values, each (N, h, T1, d_k) (see MultiHeadAttention.call).
          return_attention_scores: also return the self-attention weights (N, h, T2, T2 or L) and
            the cross-attention weights (N, h, T2, T1).

        Returns:
          (N, T2, d); with caches, ((N, T2, d), the updated self-attention cache); with
          return_attention_scores, the two weights after those.
        """
        if self_cache is None:  # training, or the reference's uncached decoding: all positions
            x, self_weights = self.self_attention_norm(x, sublayer=lambda x: self.self_attention(
                x, x, attention_mask=target_mask, causal=True, training=training, return_attention_scores=True),
                training=training)  # (N, T2, d)
        else:  # new positions: earlier ones are in the cache, later ones do not exist yet
            x, self_cache, self_weights = self.self_attention_norm(x, sublayer=lambda x: self.self_attention(
                x, x, attention_mask=target_mask, cache=self_cache, cache_index=cache_index,
                return_attention_scores=True), training=training)  # (N, T2, d)
        x, *_, weights = self.cross_attention_norm(x, sublayer=lambda x: self.cross_attention(
            x, memory, attention_mask=source_mask, cache=cross_cache, training=training,
            return_attention_scores=True), training=training)  # (N, T2, d)
        x = self.feed_forward_norm(x, sublayer=self.feed_forward, training=training)  # (N, T2, d)
        returned = (x,) + (() if self_cache is None else (self_cache,))
        returned += (self_weights, weights) if return_attention_scores else ()
        return returned[0] if len(returned) == 1 else returned


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
      token_count: the number of real tokens to divide by, from this batch's: by default itself;
        data-parallel training passes the mean over the replicas (devices.mean_over_replicas), so
        that every token of the whole batch weighs the same however unevenly they are split.
      parts: the primitives to build with (Parts; default: the plain ones).
    """

    def __init__(self, epsilon=0.1, pad_id=0, label_map=None, name="label_smoothed_cross_entropy",
                 token_count=None, parts=None, **kwargs):
        super().__init__(name=name, reduction="sum_over_batch_size", **kwargs)
        self.epsilon, self.pad_id = epsilon, pad_id
        self.label_map = None if label_map is None else [int(i) for i in label_map]
        self.token_count = token_count
        self.cross_entropy = (parts or PLAIN).cross_entropy or smoothed_cross_entropy

    def call(self, labels, logits):
        """labels (N, T2) int, logits (N, T2, V) -> per-token loss (N, T2), scaled so that Keras'
        reduction (sum / (N * T2)) gives the mean over the real tokens."""
        labels = ops.cast(labels, "int32")  # (N, T2)
        if self.label_map is not None:
            labels = ops.take(ops.convert_to_tensor(np.asarray(self.label_map, np.int32)), labels)  # (N, T2) columns
        per_token = self.cross_entropy(ops.cast(logits, "float32"), labels, self.epsilon)  # (N, T2)
        mask = ops.cast(ops.not_equal(labels, self.pad_id), "float32")  # (N, T2)
        size = ops.cast(ops.shape(mask)[0] * ops.shape(mask)[1], "float32")
        tokens = ops.sum(mask) if self.token_count is None else self.token_count(ops.sum(mask))  # real tokens
        return per_token * mask * (size / ops.maximum(tokens, 1.0))  # (N, T2)

    def get_config(self):
        return {"name": self.name, "epsilon": self.epsilon, "pad_id": self.pad_id, "label_map": self.label_map}


# 5.3 Optimizer: Adam (beta1 0.9, beta2 0.98, eps 1e-9: model.compile_model builds it) with this schedule

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

