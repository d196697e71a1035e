"""The Transformer: encoder and decoder stacks over one shared embedding matrix.

`make_model(hp, vocab_size)` is the only place that reads hyperparameters; the layers in modules.py
take plain arguments. Shape letters as in modules.py.
"""
import warnings

import keras
import numpy as np
from keras import ops

from modules import (PACKAGE, DecoderBlock, EncoderBlock, LabelSmoothedCrossEntropy,
                     PositionalEncoding, TokenEmbedding, WarmupInverseSqrt)

PAD, BOS, EOS = 0, 2, 3
# The first greedy step attends over one key; Keras warns about a softmax over an axis of size 1.
warnings.filterwarnings("ignore", message="You are using a softmax over axis")


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

    def greedy_decode(self, source, max_len=None):
        """Translate a batch greedily, stopping once every sentence has produced </s>.

        Args:
          source: (N, T1) ids (with </s>, right-padded).
          max_len: most output tokens; default 1.5 * T1 + 10.

        Returns:
          (N, L) int32 NumPy array: the output ids, </s> included, <pad> after it.
        """
        source = ops.convert_to_tensor(source, "int32")
        n, t1 = ops.shape(source)[0], ops.shape(source)[1]
        max_len = int(1.5 * t1) + 10 if max_len is None else max_len
        if self.positional == "learned":
            max_len = min(max_len, self.maxlen2)
        memory, source_mask = self.encode(source, training=False)  # (N, T1, d)
        decode = self.compiled_decode()
        target_in = np.full((n, 1), BOS, np.int32)  # (N, 1)
        finished = np.zeros(n, bool)  # (N,)
        outputs = []
        for _ in range(max_len):
            logits = decode(ops.convert_to_tensor(target_in), memory, source_mask)  # (N, t, V)
            next_ids = ops.convert_to_numpy(ops.argmax(logits[:, -1], axis=-1)).astype(np.int32)  # (N,)
            next_ids[finished] = PAD
            outputs.append(next_ids)
            finished |= next_ids == EOS
            if finished.all():
                break
            target_in = np.concatenate([target_in, next_ids[:, None]], axis=1)  # (N, t+1)
        return np.stack(outputs, axis=1)  # (N, L)

    def compiled_decode(self):
        """self.decode for inference, compiled once for all shapes where the backend allows it.

        On TensorFlow a tf.function with relaxed shapes: one trace serves every prefix length,
        instead of running the decoder op by op in eager mode.
        """
        if getattr(self, "_compiled_decode", None) is None:
            fn = lambda target_in, memory, source_mask: self.decode(target_in, memory, source_mask, training=False)
            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf
                fn = tf.function(fn, reduce_retracing=True)
            self._compiled_decode = fn
        return self._compiled_decode

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
    label-smoothed cross-entropy over non-pad tokens."""
    optimizer = keras.optimizers.Adam(learning_rate=WarmupInverseSqrt(hp.lr, hp.warmup_steps),
                                      beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy(hp.smoothing, pad_id=PAD))
    return model
