"""Faster kernels for some of the primitives the layers are built from (modules.Parts), and for
the optimizer and beam search's cache: each the smallest piece that carries its gain.

Each has the weights, the saved format and (within rounding) the values and gradients of the plain
primitive it replaces; tests/test_fast.py checks each against it, at default and other settings.
--kernels (auto, plain, fast, or a list of the names below) chooses them when a model is built:
`choose` resolves it once into a Choice: the modules.Parts the model hands to its layers, whose
own `call` runs either way, the optimizer model.compile_model builds, and the cache layout
decoding.beam_loop uses. docs/archive/speed-to-2026-12-05.md gives each one's measured gain
("What each of fast.py's kernels gains").

  projections             the attention's projections and the output logits as 2-D matmuls
  feed_forward            the kernel-size-1 convolutions as matmuls with their kernels
  dropout                 one random 32-bit integer per two elements (TensorFlow)
  layer_norm              layer normalization with its gradient written out (TensorFlow)
  cross_entropy           the smoothed loss with its gradient written out
  adam                    Adam's update of each weight as one fused kernel (TensorFlow)
  beam_cache              beam search without reordering caches (decoding.InPlaceBeamCache)

Decoding as one graph (no XLA, a CPU's default) also writes into its caches with TensorFlow's own op
(`decoding_parts`), chosen with the model's xla_decoding, not by --kernels.
"""
import dataclasses

import keras
from keras import ops

import modules


# The linear maps: every position's vector times one weight matrix, as one 2-D matmul

def matmul_rows(x, w, transpose=False):
    """x (..., in) times the matrix w (in, out), or times w (out, in) transposed -> (..., out), on
    TensorFlow as one 2-D matmul of x's rows: Keras writes a (N, T, in) tensor times a matrix as
    tf.tensordot, a dozen graph ops of shape arithmetic around the product (and a transposed
    matrix as a copy), traced into every graph and run at every decoding step."""
    if keras.backend.backend() != "tensorflow" or len(w.shape) != 2:
        return modules.matmul_transposed(x, w) if transpose else ops.matmul(x, w)  # (..., out)
    import tensorflow as tf

    y = tf.matmul(tf.reshape(x, (-1, x.shape[-1])), w, transpose_b=transpose)  # (rows, out)
    out = w.shape[0] if transpose else w.shape[1]
    lead = tuple(x.shape[1:-1])
    if None in lead:  # axes after the first of unknown length: x's shape, read as the graph runs
        return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [out]], 0))  # (..., out)
    return tf.reshape(y, (-1, *lead, out))  # (..., out)


def matmul_rows_transposed(x, w):
    """modules.matmul_transposed(x, w) for a matrix w (out, in) (the output logits, 3.4), as
    `matmul_rows` with w transposed."""
    return matmul_rows(x, w, transpose=True)


class Dense(keras.layers.Dense):
    """keras.layers.Dense (the attention's projections, 3.2.2) with its matmul as `matmul_rows`."""

    def call(self, inputs, training=None):
        if self.quantization_mode is not None or self.lora_enabled:
            return super().call(inputs, training=training)
        x = matmul_rows(inputs, ops.cast(self.kernel, inputs.dtype))  # (..., units)
        if self.bias is not None:
            x = ops.add(x, ops.cast(self.bias, inputs.dtype))  # (..., units)
        return x if self.activation is None else self.activation(x)


# Feed-forward: a kernel-size-1 convolution is a matmul with its (1, in, out) kernel

class Pointwise(modules.PointwiseConv):
    """modules.PointwiseConv as a matmul (`matmul_rows`) with the squeezed (1, in, out) kernel (not
    sliced: a slice's gradient is a copy into zeros), the bias and the activation."""

    def call(self, x):
        kernel = ops.cast(ops.squeeze(self.kernel, 0), x.dtype)  # (in, out)
        y = matmul_rows(x, kernel)  # (N, T, out)
        if self.use_bias:
            y = y + ops.cast(self.bias, x.dtype)  # (N, T, out)
        return self.activation(y)  # (N, T, out)


# Dropout: cheaper random numbers

class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout drawing one 32-bit integer per two elements on TensorFlow.

    An element is kept when its 16 bits are >= round(rate * 65536): a rate within 1/131072 of the
    asked one (0.15 -> 0.149994). Keras draws one uniform float per element (in bfloat16 under
    mixed precision, the dearer conversion). The gradient is the same mask, written out. Same seed
    generator, so a resumed run continues the same random stream. Other backends: Keras' dropout.
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


# Layer normalization: the gradient in closed form

class LayerNormalization(keras.layers.LayerNormalization):
    """keras.layers.LayerNormalization (last axis, in float32 under mixed precision) whose gradient
    is written out on TensorFlow.

    The automatic gradient runs through the mean, the variance and the rsqrt separately; the
    closed form dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma,
    takes fewer passes over the activations. Other backends and settings: Keras' layer.
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


# Loss: the gradient in closed form

def smoothed_cross_entropy(logits, labels, epsilon):
    """modules.smoothed_cross_entropy with its gradient, softmax(z) - eps / V - (1 - eps) [v = y],
    written out: the softmax reuses the forward pass's exponentials, and the label term is
    subtracted at the N * T label positions (a scatter) instead of through a dense (N, T, V) pass.

    Value: lse - (1 - eps) z_y - eps mean_v z_v, with z the logits and lse their log-sum-exp.
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


# Adam: one fused update per weight

@keras.saving.register_keras_serializable(package=modules.PACKAGE, name="FusedAdam")
class Adam(keras.optimizers.Adam):
    """keras.optimizers.Adam whose update of each TensorFlow variable is one kernel.

    Keras' Adam updates a weight with about a dozen elementwise ops, each a pass over the weight,
    its moments or a temporary; TensorFlow's `ResourceApplyAdam` applies the same rule
    (m += (g - m)(1 - b1), v += (g^2 - v)(1 - b2), w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps))
    in one pass. Elsewhere (other backends, under a tf.distribute strategy, amsgrad) it is Keras'
    Adam. Same variables, so checkpoints are shared.
    """

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        if tf.distribute.has_strategy():  # mirrored variables: no single handle to update
            return super().update_step(gradient, variable, learning_rate)
        # Keras keeps the moments in private lists; there is no public way to reach a variable's own.
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.value.handle, v=v.value.handle,
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.convert_to_tensor(tf.cast(gradient, dtype)))  # sparse (embedding) gradients: dense


# Decoding's writes as one graph: TensorFlow's own op for a slice written at a step

def slice_update_in_graph(x, start, update):
    """ops.slice_update(x, start, update) as TensorFlow's strided-slice update. Keras writes it as
    XLA's dynamic-update-slice, which a loop run as one graph, without XLA, compiles on its own for
    every shape it meets (a program each, kept in the persistent compilation cache): many, once a
    batch shrinks (decoding.set_aside). start: ints or int scalar tensors, one per axis of x."""
    import tensorflow as tf

    begin = tf.stack([tf.cast(i, tf.int32) for i in start])  # (rank,)
    return tf.raw_ops.TensorStridedSliceUpdate(input=x, begin=begin, end=begin + tf.shape(update),
                                               strides=tf.ones_like(begin), value=update)


class GrowingCache:
    """modules.FixedLengthCache's self-attention cache holding only the entries written so far:
    a step appends its own (so a step's index is the cache's length) and attention reads no empty
    entry. A step then writes and attends over as many entries as have been decoded, where the
    fixed cache's costs as many as the longest output may take. Its length changes from step to
    step: for loops run as one graph, which take every shape (TensorFlow)."""

    @staticmethod
    def empty(rows, num_heads, length, d_k, dtype):
        """The cache before the first step: (rows, h, 0, d_k), its length left unknown to the graph
        (it grows from step to step of the loop)."""
        import tensorflow as tf

        empty = tf.zeros(tf.stack([rows, num_heads, 0, d_k]), dtype)  # (rows, h, 0, d_k)
        return tf.raw_ops.PlaceholderWithDefault(input=empty, shape=[None, num_heads, None, d_k])

    @staticmethod
    def write(cache, index, new):
        """cache (N, h, index, d_k) with new (N, h, G, d_k) after its entries: (N, h, index + G, d_k).
        An index other than the entries held (an attention edited to write elsewhere) stops the loop
        with an error that says so: the fixed-length cache (--jit_compile on) writes at any entry."""
        import tensorflow as tf

        held = tf.debugging.assert_equal(
            tf.shape(cache)[2], tf.cast(index, tf.int32),
            message="kernels.fast.GrowingCache: a decoding step writes at cache_index, and this cache, which "
                    "grows a step at a time (decoding as one graph), holds just the entries written so far, so "
                    "cache_index must be their number; decode with --jit_compile on for the fixed-length cache "
                    "(modules.FixedLengthCache), which writes at any entry")
        with tf.control_dependencies([held]):
            return ops.concatenate([cache, ops.cast(new, cache.dtype)], axis=2)  # (N, h, index + G, d_k)

    @staticmethod
    def entries(cache, written):
        """The entries the cache holds once a step has written `written` more."""
        return ops.shape(cache)[2] + written


def decoding_parts(parts, xla_decoding):
    """parts with decoding's cache and writes as its loops run: XLA's write and a cache of fixed
    length (the plain ones) under XLA or JAX, which fix every shape; where the loops run as one
    graph (model.Transformer's choice), TensorFlow's write and a cache that grows a step at a time."""
    if xla_decoding or keras.backend.backend() != "tensorflow":
        return parts
    return dataclasses.replace(parts, slice_update=slice_update_in_graph, cache=GrowingCache)


# Choosing

KERNELS = ("projections", "feed_forward", "dropout", "layer_norm", "cross_entropy", "adam", "beam_cache")
TENSORFLOW_ONLY = {"projections", "dropout", "layer_norm", "adam"}
# kernel -> the modules.Parts fields it fills, each with its faster part
PARTS = {
    "projections": {"Dense": Dense, "matmul_transposed": matmul_rows_transposed},
    "feed_forward": {"Pointwise": Pointwise},
    "dropout": {"Dropout": Dropout},
    "layer_norm": {"LayerNormalization": LayerNormalization},
    "cross_entropy": {"cross_entropy": smoothed_cross_entropy},
}


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a --kernels value chose, resolved once when the model is built (model.Transformer's
    `kernels`): every place that runs a kernel reads its own field here, and nothing else tests
    the choice."""

    names: frozenset  # the chosen kernels, of KERNELS
    parts: modules.Parts  # the primitives every layer is built with
    optimizer: type  # Adam's class for model.compile_model: Keras' own, or the fused one
    in_place_beam_cache: bool  # beam search keeps its caches in place (decoding.InPlaceBeamCache)


def choose(kernels):
    """The Choice of a --kernels value on this backend (see `chosen`)."""
    names = chosen(kernels)
    return Choice(names=names, parts=parts(names), optimizer=Adam if "adam" in names else keras.optimizers.Adam,
                  in_place_beam_cache="beam_cache" in names)


def chosen(kernels):
    """The kernels a --kernels value names on this backend, a frozenset of KERNELS. kernels:
    auto (every kernel on TensorFlow, where each was measured faster, docs/archive/speed-to-2026-12-05.md,
    projections for a shorter first pass as one graph, docs/speed.md; none elsewhere), plain (none),
    fast (every one), or a comma-separated list (the benchmarks measure them one by one)."""
    tensorflow = keras.backend.backend() == "tensorflow"
    if kernels == "plain" or (kernels == "auto" and not tensorflow):
        return frozenset()
    names = set(KERNELS) if kernels in ("auto", "fast") else {k.strip() for k in kernels.split(",") if k.strip()}
    unknown = names - set(KERNELS)
    if unknown:
        raise ValueError(f"unknown kernels {', '.join(sorted(unknown))}: choose auto, plain, fast or "
                         f"a list of {', '.join(KERNELS)}")
    return frozenset(names if tensorflow else names - TENSORFLOW_ONLY)


def parts(names):
    """The modules.Parts of the chosen kernels (names, from `chosen`): the faster parts among
    them, the plain ones elsewhere."""
    return dataclasses.replace(modules.PLAIN, **{field: part for name in names if name in PARTS
                                                 for field, part in PARTS[name].items()})
