"""Building blocks of the Transformer (Vaswani et al. 2017) as Keras 3 layers.

Written with `keras.ops` only, so the same code runs on the TensorFlow, JAX and PyTorch backends.
Layers take plain arguments (no hyperparameter object) and do no I/O. Masks are built once from
token ids by the model and passed by name.

Shape letters: N batch, T1 source length, T2 target length, T any length, h heads,
d d_model, d_k d_model/h, f d_ff, V vocabulary.
"""
import math

import keras
import numpy as np
from keras import ops

PACKAGE = "transformer"
NEG_INF = -1e9  # added to masked attention logits


def matmul_transposed(a, b):
    """a @ b^T over the last two axes: a (..., M, K), b (..., N, K) -> (..., M, N).

    On TensorFlow the matmul kernel reads b transposed itself (`transpose_b`), and so do the
    kernels of its gradient; `ops.matmul(a, ops.transpose(b))` copies b, and its gradient copies
    back, once each per call: for the attention logits nine (N, h, d_k, T) copies a step each way,
    and the (V, d) output projection's gradient (README, Speed). Other backends: that expression.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.matmul(a, ops.swapaxes(b, -1, -2))
    import tensorflow as tf

    if len(b.shape) == 2 and len(a.shape) > 2:  # rows against one matrix: a plain MatMul of 2-D rows
        rows = tf.matmul(tf.reshape(a, (-1, a.shape[-1])), b, transpose_b=True)  # (rows, N)
        return tf.reshape(rows, tf.concat([tf.shape(a)[:-1], tf.shape(b)[:1]], 0))
    return tf.matmul(a, b, transpose_b=True)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout with cheaper random numbers on TensorFlow.

    Keras draws one uniform float per element (in bfloat16 under mixed precision, the dearer
    conversion). With the TensorFlow backend this layer draws one 32-bit integer per two elements
    and keeps an element when its 16 bits are >= round(rate * 65536): a rate within 1/131072 of
    the asked one (0.15 -> 0.149994). The gradient is the same mask, written out. About half the
    time of Keras' dropout forward and backward on the CPU (README, Speed). Same seed generator, so
    a resumed run continues the same random stream. Other backends: Keras' dropout.
    """

    def call(self, inputs, training=False):
        if not (training and 0 < self.rate < 1) or self.noise_shape is not None \
                or keras.backend.backend() != "tensorflow":
            return super().call(inputs, training=training)
        import tensorflow as tf

        seed = tf.cast(self.seed_generator.next(), tf.int32)
        count = tf.size(inputs)
        bits = tf.random.stateless_uniform(((count + 1) // 2,), seed, minval=None, maxval=None, dtype=tf.uint32)
        halves = tf.reshape(tf.bitcast(bits, tf.uint16), (-1,))  # (2 * ceil(count / 2),)
        if not (inputs.shape[-1] is not None and inputs.shape[-1] % 2 == 0):  # count may be odd
            halves = halves[:count]
        keep = tf.reshape(halves, tf.shape(inputs)) >= tf.constant(round(self.rate * 65536), tf.uint16)
        scale = tf.constant(1.0 / (1.0 - self.rate), inputs.dtype)

        def masked(t):
            return tf.where(keep, t * scale, tf.zeros((), t.dtype))

        @tf.custom_gradient
        def dropout(x):
            return masked(x), masked  # the gradient goes through the same mask

        return dropout(inputs)


@keras.saving.register_keras_serializable(package=PACKAGE)
class LayerNormalization(keras.layers.LayerNormalization):
    """keras.layers.LayerNormalization (last axis, in float32 under mixed precision) whose gradient
    is written out on TensorFlow.

    The automatic gradient of Keras' formulation runs through the mean, the variance and the
    rsqrt separately, some twenty passes over the activations; the closed form,
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with dxhat = dy * gamma, takes
    about half (README, Speed). Same weights; other backends and settings: Keras' layer.
    """

    def call(self, inputs):
        if keras.backend.backend() != "tensorflow" or self.axis not in (-1, [-1], len(inputs.shape) - 1) \
                or self.rms_scaling or not (self.center and self.scale):
            return super().call(inputs)
        import tensorflow as tf

        epsilon = self.epsilon

        @tf.custom_gradient
        def norm(x, gamma, beta):
            xf = tf.cast(x, tf.float32)  # (..., d)
            centred = xf - tf.reduce_mean(xf, -1, keepdims=True)  # (..., d)
            rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(centred), -1, keepdims=True) + epsilon)  # (..., 1)
            xhat = centred * rstd  # (..., d)

            def grad(upstream):
                g = tf.cast(upstream, tf.float32)  # (..., d)
                outer = tf.range(tf.rank(g) - 1)
                dxhat = g * gamma  # (..., d)
                dx = rstd * (dxhat - tf.reduce_mean(dxhat, -1, keepdims=True)
                             - xhat * tf.reduce_mean(dxhat * xhat, -1, keepdims=True))  # (..., d)
                return tf.cast(dx, x.dtype), tf.reduce_sum(g * xhat, outer), tf.reduce_sum(g, outer)

            return tf.cast(xhat * gamma + beta, self.compute_dtype), grad

        return norm(inputs, tf.cast(self.gamma.value, tf.float32), tf.cast(self.beta.value, tf.float32))


@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model), with <pad> embedding to zeros (section 3.4).

    The same matrix is the output projection (`project`): the reference's 2019 version shares one
    matrix between source, target and the pre-softmax linear layer.

    Args:
      vocab_size: V.
      d_model: d.
      pad_id: the id whose embedding is zero.
    """

    def __init__(self, vocab_size, d_model, pad_id=0, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.pad_id = vocab_size, d_model, pad_id

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))

    def call(self, ids):
        """ids (N, T) int -> (N, T, d)."""
        x = ops.take(self.embeddings, ids, axis=0)  # (N, T, d)
        keep = ops.cast(ops.not_equal(ids, self.pad_id), x.dtype)  # (N, T)
        return x * ops.expand_dims(keep, -1) * math.sqrt(self.d_model)  # (N, T, d)

    def project(self, x, rows=None):
        """x (N, T, d) -> logits (N, T, V) in float32, through the transposed embedding matrix
        (the matmul in x's dtype: bfloat16/float16 under mixed precision). With rows (V',) int ids,
        only those rows of the matrix: logits (N, T, V') over those ids, in their order."""
        w = self.embeddings if rows is None else ops.take(self.embeddings, rows, axis=0)  # (V or V', d)
        return ops.cast(matmul_transposed(x, ops.cast(w, x.dtype)), "float32")  # (N, T, V or V')

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "pad_id": self.pad_id}


def sinusoid(length, d_model, dtype="float32", start=0):
    """Sinusoid positional encoding (section 3.5) of positions start..start+length-1: (length, d).

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


def attention_bias(key_padding_mask, causal, query_length, key_length):
    """Additive float32 attention bias from masks: 0 where attending is allowed, NEG_INF where not
    (float32 under mixed precision too: the softmax it is added to runs in float32).

    Args:
      key_padding_mask: (N, Tk) bool, True at real tokens; or None.
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
        future = ops.reshape(ops.greater_equal(q, k), (1, 1, query_length, key_length))  # (1, 1, Tq, Tk)
        allowed = future if allowed is None else ops.logical_and(allowed, future)  # (N, 1, Tq, Tk)
    if allowed is None:
        return None
    return ops.where(allowed, ops.zeros((), "float32"), ops.full((), NEG_INF, "float32"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (sections 3.2.1, 3.2.2).

    Args:
      d_model: d.
      num_heads: h; d must be divisible by h.
      dropout_rate: dropout on the attention weights.
    """

    def __init__(self, d_model, num_heads, dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.d_model, self.num_heads, self.dropout_rate = d_model, num_heads, dropout_rate
        self.d_k = d_model // num_heads
        self.query_dense = keras.layers.Dense(d_model, name="query")
        self.key_dense = keras.layers.Dense(d_model, name="key")
        self.value_dense = keras.layers.Dense(d_model, name="value")
        self.output_dense = keras.layers.Dense(d_model, name="output")
        self.dropout = Dropout(dropout_rate)

    def build(self, query_shape, memory_shape=None):
        memory_shape = query_shape if memory_shape is None else memory_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(memory_shape)
        self.value_dense.build(memory_shape)
        self.output_dense.build(query_shape[:-1] + (self.d_model,))

    def split_heads(self, x):
        """(N, T, d) -> (N, h, T, d_k)."""
        n, t = ops.shape(x)[0], ops.shape(x)[1]
        x = ops.reshape(x, (n, t, self.num_heads, self.d_k))  # (N, T, h, d_k)
        return ops.transpose(x, (0, 2, 1, 3))  # (N, h, T, d_k)

    def call(self, query, memory, key_padding_mask=None, causal=False, training=None):
        """Attend from query to memory.

        Args:
          query: (N, Tq, d).
          memory: (N, Tk, d): the query itself for self-attention, the encoder output otherwise.
          key_padding_mask: (N, Tk) bool, True at real tokens.
          causal: mask keys after each query position.

        Returns:
          (N, Tq, d).
        """
        # 1. project and split into heads
        q = self.split_heads(self.query_dense(query))  # (N, h, Tq, d_k)
        k, v = self.memory_heads(memory)  # (N, h, Tk, d_k) each
        # 2. masks as an additive bias
        bias = attention_bias(key_padding_mask, causal, ops.shape(q)[2], ops.shape(k)[2])
        # 3. attend
        return self.attend(q, k, v, bias, training=training)  # (N, Tq, d)

    def memory_heads(self, memory):
        """Keys and values of memory (N, Tk, d), split into heads: two (N, h, Tk, d_k)."""
        return self.split_heads(self.key_dense(memory)), self.split_heads(self.value_dense(memory))

    def attend(self, q, k, v, bias=None, training=None):
        """Scaled dot-product attention of heads q (N, h, Tq, d_k) over k, v (N, h, Tk, d_k),
        with an additive float32 bias broadcastable to (N, h, Tq, Tk); returns (N, Tq, d).

        The products run in the inputs' dtype; the scaling, the bias and the softmax in float32
        (under mixed precision too: -1e9 does not fit float16)."""
        logits = ops.cast(matmul_transposed(q, k), "float32")  # (N, h, Tq, Tk)
        logits = logits / math.sqrt(self.d_k)  # (N, h, Tq, Tk)
        if bias is not None:
            logits = logits + bias  # (N, h, Tq, Tk)
        weights = ops.cast(ops.softmax(logits, axis=-1), v.dtype)  # (N, h, Tq, Tk)
        weights = self.dropout(weights, training=training)  # (N, h, Tq, Tk)
        out = ops.matmul(weights, v)  # (N, h, Tq, d_k)
        out = ops.transpose(out, (0, 2, 1, 3))  # (N, Tq, h, d_k)
        out = ops.reshape(out, (ops.shape(out)[0], ops.shape(out)[1], self.d_model))  # (N, Tq, d)
        return self.output_dense(out)  # (N, Tq, d)

    def self_attention_step(self, x, cache_k, cache_v, step, bias, group=1):
        """Self-attention of one new position per row over the cached earlier ones.

        Rows come in groups of G per sentence (beam search's hypotheses; G = 1 for greedy). The
        cache of a sentence holds, for every position p and slot g, the key/value written there by
        the row that sat in slot g at step p, at index p * G + g. Rows are never moved: each
        attends over all L * G entries of its sentence, and `bias` lets through only those of its
        own history (its ancestors' entries), so beam search needs no cache reordering.

        Args:
          x: (N*G, 1, d) the new position's input.
          cache_k, cache_v: (N, h, L*G, d_k) the sentence caches.
          step: int scalar, the new position's index.
          bias: additive mask broadcastable to (N, h, G, L*G): 0 where a row may attend.
          group: G, a Python int.

        Returns:
          output (N*G, 1, d), and the caches with the G entries of position `step` written.
        """
        x = ops.reshape(x, (-1, group, self.d_model))  # (N, G, d)
        q = self.split_heads(self.query_dense(x))  # (N, h, G, d_k)
        k, v = self.memory_heads(x)  # (N, h, G, d_k) each
        start = (0, 0, step * group, 0)
        cache_k = ops.slice_update(cache_k, start, ops.cast(k, cache_k.dtype))  # (N, h, L*G, d_k)
        cache_v = ops.slice_update(cache_v, start, ops.cast(v, cache_v.dtype))  # (N, h, L*G, d_k)
        out = self.attend(q, cache_k, cache_v, bias)  # (N, G, d)
        return ops.reshape(out, (-1, 1, self.d_model)), cache_k, cache_v  # (N*G, 1, d)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate}


@keras.saving.register_keras_serializable(package=PACKAGE)
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network (section 3.3) as two kernel-size-1 convolutions.

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
        """x (N, T, d) -> (N, T, d).

        A kernel-size-1 convolution is a matmul with its (1, in, out) kernel; it is computed as
        one, which costs less per call than the convolution op on the CPU (same weights). The
        kernel is squeezed to (in, out), not sliced: a slice's gradient is a copy into zeros.
        """
        h = ops.relu(ops.matmul(x, ops.squeeze(self.inner.kernel, 0)) + self.inner.bias)  # (N, T, f)
        return ops.matmul(h, ops.squeeze(self.outer.kernel, 0)) + self.outer.bias  # (N, T, d)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff}


@keras.saving.register_keras_serializable(package=PACKAGE)
class AddNorm(keras.layers.Layer):
    """Residual connection then layer normalization: LayerNorm(x + Dropout(sublayer(x))) (5.4).

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


@keras.saving.register_keras_serializable(package=PACKAGE)
class EncoderBlock(keras.layers.Layer):
    """Self-attention and feed-forward, each wrapped in AddNorm (section 3.1, encoder)."""

    def __init__(self, d_model, d_ff, num_heads, dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff, self.num_heads, self.dropout_rate = d_model, d_ff, num_heads, dropout_rate
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout_rate, name="self_attention")
        self.self_attention_norm = AddNorm(dropout_rate, name="self_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, name="feed_forward")
        self.feed_forward_norm = AddNorm(dropout_rate, name="feed_forward_norm")

    def build(self, x_shape):
        for layer in (self.self_attention, self.self_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(x_shape)

    def call(self, x, padding_mask, training=None):
        """x (N, T1, d), padding_mask (N, T1) bool -> (N, T1, d)."""
        a = self.self_attention(x, x, key_padding_mask=padding_mask, training=training)  # (N, T1, d)
        x = self.self_attention_norm(x, a, training=training)  # (N, T1, d)
        f = self.feed_forward(x)  # (N, T1, d)
        return self.feed_forward_norm(x, f, training=training)  # (N, T1, d)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "num_heads": self.num_heads, "dropout_rate": self.dropout_rate}


@keras.saving.register_keras_serializable(package=PACKAGE)
class DecoderBlock(keras.layers.Layer):
    """Causal self-attention, attention over the encoder output, feed-forward (3.1, decoder)."""

    def __init__(self, d_model, d_ff, num_heads, dropout_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff, self.num_heads, self.dropout_rate = d_model, d_ff, num_heads, dropout_rate
        self.self_attention = MultiHeadAttention(d_model, num_heads, dropout_rate, name="self_attention")
        self.self_attention_norm = AddNorm(dropout_rate, name="self_attention_norm")
        self.cross_attention = MultiHeadAttention(d_model, num_heads, dropout_rate, name="cross_attention")
        self.cross_attention_norm = AddNorm(dropout_rate, name="cross_attention_norm")
        self.feed_forward = FeedForward(d_model, d_ff, name="feed_forward")
        self.feed_forward_norm = AddNorm(dropout_rate, name="feed_forward_norm")

    def build(self, x_shape, memory_shape=None):
        memory_shape = x_shape if memory_shape is None else memory_shape
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        for layer in (self.self_attention_norm, self.cross_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(x_shape)

    def call(self, x, memory, target_mask, source_mask, training=None):
        """Decoder block.

        Args:
          x: (N, T2, d) decoder states.
          memory: (N, T1, d) encoder output.
          target_mask: (N, T2) bool, True at real target tokens.
          source_mask: (N, T1) bool, True at real source tokens.

        Returns:
          (N, T2, d).
        """
        a = self.self_attention(x, x, key_padding_mask=target_mask, causal=True, training=training)  # (N, T2, d)
        x = self.self_attention_norm(x, a, training=training)  # (N, T2, d)
        c = self.cross_attention(x, memory, key_padding_mask=source_mask, training=training)  # (N, T2, d)
        x = self.cross_attention_norm(x, c, training=training)  # (N, T2, d)
        f = self.feed_forward(x)  # (N, T2, d)
        return self.feed_forward_norm(x, f, training=training)  # (N, T2, d)

    def call_step(self, x, memory_kv, source_bias, cache_k, cache_v, step, self_bias, group=1):
        """One decoding position with cached keys/values (inference only).

        Args:
          x: (N*G, 1, d) the new position; G rows (beam search's hypotheses) per sentence, adjacent.
          memory_kv: keys and values of the encoder output, (N, h, T1, d_k) each, computed once and
            shared by the G rows of a sentence: they attend to it as G query positions.
          source_bias: (N, 1, 1, T1) additive bias from the source padding mask.
          cache_k, cache_v: (N, h, L*G, d_k) this block's self-attention cache (see
            MultiHeadAttention.self_attention_step).
          step: the position's index.
          self_bias: (N or 1, 1, G, L*G) which cache entries each row may attend to.
          group: G, a Python int.

        Returns:
          (N*G, 1, d) and the updated caches.
        """
        a, cache_k, cache_v = self.self_attention.self_attention_step(
            x, cache_k, cache_v, step, self_bias, group)  # (N*G, 1, d)
        x = self.self_attention_norm(x, a)  # (N*G, 1, d)
        queries = ops.reshape(x, (-1, group, self.d_model))  # (N, G, d)
        c = self.cross_attention.attend(
            self.cross_attention.split_heads(self.cross_attention.query_dense(queries)), *memory_kv,
            source_bias)  # (N, G, d)
        x = self.cross_attention_norm(x, ops.reshape(c, (-1, 1, self.d_model)))  # (N*G, 1, d)
        x = self.feed_forward_norm(x, self.feed_forward(x))  # (N, 1, d)
        return x, cache_k, cache_v

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff,
                "num_heads": self.num_heads, "dropout_rate": self.dropout_rate}


def label_smoothing(inputs, epsilon=0.1):
    """Smooth one-hot targets (section 5.4): (1 - epsilon) * inputs + epsilon / V.

    inputs (..., V) one-hot -> (..., V). With V = 3 and epsilon 0.1: 0.9333 and 0.0333.
    """
    v = ops.shape(inputs)[-1]
    return (1.0 - epsilon) * inputs + epsilon / v


def smoothed_cross_entropy(logits, labels, epsilon):
    """Per-token cross-entropy against (1 - eps) one_hot(labels) + eps / V: logits (N, T, V) float32,
    labels (N, T) int32 -> (N, T).

    -(1 - eps) log p(y) - eps / V sum_v log p(v) = lse - (1 - eps) z_y - eps mean_v z_v, with z the
    logits and lse their log-sum-exp. Its gradient, softmax(z) - eps / V - (1 - eps) [v = y], is
    written out: the softmax reuses the forward pass's exponentials (one multiply), and the label
    term is subtracted at the N * T label positions only (a scatter), not through a dense
    comparison. The automatic gradient of the label gather would scatter into a dense (N, T, V)
    zero tensor, a pass as large as the logits.
    """
    vocab_size = ops.shape(logits)[-1]

    @ops.custom_gradient
    def loss(z):
        peak = ops.max(z, axis=-1, keepdims=True)  # (N, T, 1)
        e = ops.exp(z - peak)  # (N, T, V), kept for the gradient
        total = ops.sum(e, axis=-1)  # (N, T), >= 1
        lse = ops.log(total) + ops.squeeze(peak, -1)  # (N, T)
        z_y = ops.squeeze(ops.take_along_axis(z, ops.expand_dims(labels, -1), axis=-1), -1)  # (N, T)
        value = lse - (1.0 - epsilon) * z_y - epsilon * ops.mean(z, axis=-1)  # (N, T)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream  # (N, T)
            dense = (e * ops.expand_dims(upstream / total, -1)
                     - ops.expand_dims(upstream * (epsilon / vocab_size), -1))  # (N, T, V)
            rows = ops.reshape(dense, (-1, vocab_size))  # (N*T, V)
            flat_labels = ops.reshape(labels, (-1,))  # (N*T,)
            at = ops.stack([ops.arange(ops.shape(flat_labels)[0], dtype=flat_labels.dtype), flat_labels], 1)
            at_label = ops.take_along_axis(rows, ops.expand_dims(flat_labels, -1), axis=-1)[:, 0]  # (N*T,)
            rows = ops.scatter_update(rows, at, at_label - ops.reshape(upstream, (-1,)) * (1.0 - epsilon))
            return ops.reshape(rows, ops.shape(dense))  # (N, T, V)

        return value, grad

    return loss(logits)


def mean_over_replicas(x):
    """The mean of a scalar over the replicas of a tf.distribute step; x itself on one device and
    on other backends (JAX's DataParallel computes on the global batch)."""
    if keras.backend.backend() != "tensorflow":
        return x
    import tensorflow as tf

    context = tf.distribute.get_replica_context()  # None in a cross-replica context
    if context is None or context.num_replicas_in_sync == 1:
        return x
    return context.all_reduce(tf.distribute.ReduceOp.MEAN, ops.stop_gradient(x))


@keras.saving.register_keras_serializable(package=PACKAGE)
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, averaged over non-pad target tokens.

    Equal to the cross-entropy against `label_smoothing(one_hot(labels))`, computed from the sparse
    labels without materialising (N, T2, V) targets (`smoothed_cross_entropy`).

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
        """labels (N, T2) int, logits (N, T2, V) -> per-token loss, scaled so that Keras' reduction
        (sum / (N * T2)) gives the mean over the real tokens (N, T2).

        Under tf.distribute each replica holds a part of the global batch, Keras divides each
        replica's loss by the number of replicas R and sums the gradients. Dividing by the mean of
        the replicas' token counts (the global count / R) instead of the replica's own makes that
        sum the gradient of the mean over all real tokens of the global batch, as on one device,
        however unevenly the tokens are split. JAX's DataParallel computes on the global batch."""
        labels = ops.cast(labels, "int32")  # (N, T2)
        if self.label_map is not None:
            labels = ops.take(ops.convert_to_tensor(np.asarray(self.label_map, np.int32)), labels)  # (N, T2) columns
        per_token = smoothed_cross_entropy(ops.cast(logits, "float32"), labels, self.epsilon)  # (N, T2)
        mask = ops.cast(ops.not_equal(labels, self.pad_id), "float32")  # (N, T2)
        size = ops.cast(ops.shape(mask)[0] * ops.shape(mask)[1], "float32")
        tokens = mean_over_replicas(ops.sum(mask))  # the real tokens of this replica's share
        return per_token * mask * (size / ops.maximum(tokens, 1.0))  # (N, T2)

    def get_config(self):
        return {"name": self.name, "epsilon": self.epsilon, "pad_id": self.pad_id, "label_map": self.label_map}


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


@keras.saving.register_keras_serializable(package=PACKAGE)
class FusedAdam(keras.optimizers.Adam):
    """keras.optimizers.Adam whose update of each TensorFlow variable is one kernel.

    Keras' Adam updates a weight with about a dozen elementwise ops, each a pass over the weight,
    its moments and temporaries. With the
    TensorFlow backend and plain (not mirrored) variables, this runs TensorFlow's fused
    `ResourceApplyAdam` instead: the same rule (m += (g - m)(1 - b1), v += (g^2 - v)(1 - b2),
    w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)) in one pass. Elsewhere (JAX, PyTorch,
    tf.distribute replicas, amsgrad) it is Keras' Adam. Same variables, so checkpoints are shared.
    """

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf
        from tensorflow.python.ops.resource_variable_ops import BaseResourceVariable

        index = self._get_variable_index(variable)
        m, v = self._momentums[index].value, self._velocities[index].value
        if not all(isinstance(x, BaseResourceVariable) for x in (variable, m, v)):  # e.g. mirrored
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.handle, v=v.handle, beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, dtype), beta1=beta_1,
            beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.convert_to_tensor(tf.cast(gradient, dtype)))  # sparse (embedding) gradients: dense


@keras.saving.register_keras_serializable(package=PACKAGE)
class GuardedAdam(FusedAdam):
    """Adam that leaves out an update whose gradients are not all finite.

    A skipped batch changes no weight, no moment and no learning-rate step; `skipped_steps`
    counts them. train.py uses it with --skip_nonfinite 1 (a NaN/Inf batch otherwise stops training).
    """

    def build(self, var_list):
        super().build(var_list)
        self.skipped_steps = self.add_variable((), initializer="zeros", dtype="int32", name="skipped_steps")

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            self.build(trainable_variables)
        finite = ops.all(ops.stack([ops.all(ops.isfinite(g)) for g in grads if g is not None]))

        def update():
            super(GuardedAdam, self).apply(grads, trainable_variables)

        def skip():
            self.skipped_steps.assign_add(1)

        ops.cond(finite, update, skip)
