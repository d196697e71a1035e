"""Yardsticks for bench/train_speed.py: the same Transformer size written the plain way, in plain
Keras 3 (keras.layers.MultiHeadAttention, Dense, implicit masks from Embedding(mask_zero=True), as
in the keras.io translation example) and in PyTorch (torch.nn.Transformer), each with a
`train_on_batch((source, decoder_input), target)` like a Keras model's.

Both have d_model, d_ff, blocks, heads and dropout of the preset, sinusoid positions, Adam, and an
output layer of the vocabulary's size (untied: the same matmul FLOPs as the port's shared matrix).
Losses: PyTorch's CrossEntropyLoss with label_smoothing and ignore_index; Keras' sparse
cross-entropy with ignore_class, without label smoothing (Keras smooths only one-hot targets).
Precision: PyTorch in float32; plain Keras in float32 ("keras", Keras' default) and in
mixed_bfloat16 ("keras_bf16", as the Keras mixed-precision guide builds it: float32 logits), so
that the port is compared with plain Keras in the precision it trains in too.
"""
import math
import os

import numpy as np


def sinusoid_table(length, d_model):
    """(length, d) sinusoid positional encodings as a NumPy float32 array: the port's own table."""
    from keras import ops

    import modules
    return ops.convert_to_numpy(modules.sinusoid(length, d_model))


def plain_keras(vocab_size, d_model, d_ff, num_blocks, num_heads, dropout_rate, maxlen=512):
    """A compiled functional Keras 3 Transformer built from stock layers."""
    import keras
    from keras import layers, ops

    class AddPositions(layers.Layer):
        """x * sqrt(d) + sinusoid positions; keeps the embedding's mask."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.supports_masking = True
            self.table = sinusoid_table(maxlen, d_model)

        def call(self, x):
            return x * math.sqrt(d_model) + ops.cast(self.table, x.dtype)[None, :ops.shape(x)[1]]

    def embed(ids):
        x = layers.Embedding(vocab_size, d_model, mask_zero=True)(ids)
        return layers.Dropout(dropout_rate)(AddPositions()(x))

    def add_norm(x, y):
        return layers.LayerNormalization(epsilon=1e-6)(layers.Add()([x, layers.Dropout(dropout_rate)(y)]))

    def feed_forward(x):
        return layers.Dense(d_model)(layers.Dense(d_ff, activation="relu")(x))

    def attention(query, value, causal=False):
        mha = layers.MultiHeadAttention(num_heads, d_model // num_heads, dropout=dropout_rate)
        return mha(query, value, use_causal_mask=causal)

    source = keras.Input((None,), dtype="int32")
    target_in = keras.Input((None,), dtype="int32")
    x = embed(source)
    for _ in range(num_blocks):
        x = add_norm(x, attention(x, x))
        x = add_norm(x, feed_forward(x))
    y = embed(target_in)
    for _ in range(num_blocks):
        y = add_norm(y, attention(y, y, causal=True))
        y = add_norm(y, attention(y, x))
        y = add_norm(y, feed_forward(y))
    logits = layers.Activation("linear", dtype="float32")(layers.Dense(vocab_size)(y))  # float32 under mixed precision
    model = keras.Model([source, target_in], logits)
    model.compile(optimizer=keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0))
    return model


class TorchTransformer:
    """torch.nn.Transformer with embeddings, sinusoid positions, an output layer and Adam."""

    def __init__(self, vocab_size, d_model, d_ff, num_blocks, num_heads, dropout_rate, smoothing=0.1,
                 seed=0, maxlen=512):
        import torch
        from torch import nn

        self.torch = torch
        torch.manual_seed(seed)
        torch.set_num_threads(os.cpu_count())
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.net = nn.Transformer(d_model, num_heads, num_blocks, num_blocks, d_ff, dropout_rate,
                                  batch_first=True)
        self.output = nn.Linear(d_model, vocab_size)
        self.dropout = nn.Dropout(dropout_rate)
        self.positions = torch.from_numpy(sinusoid_table(maxlen, d_model))
        self.parameters = [p for m in (self.embedding, self.net, self.output) for p in m.parameters()]
        self.optimizer = torch.optim.Adam(self.parameters, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.loss = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=smoothing)

    def embed(self, ids):
        return self.dropout(self.embedding(ids) * math.sqrt(self.d_model) + self.positions[:ids.shape[1]])

    def train_on_batch(self, inputs, target):
        """One Adam step on ((source (N, T1), decoder input (N, T2)), target (N, T2)); returns the loss."""
        torch = self.torch
        source, target_in = (torch.from_numpy(np.asarray(a, np.int64)) for a in inputs)
        target = torch.from_numpy(np.asarray(target, np.int64))
        length = target_in.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)  # True: not allowed
        h = self.net(self.embed(source), self.embed(target_in), tgt_mask=causal, tgt_is_causal=True,
                     src_key_padding_mask=source == 0, tgt_key_padding_mask=target_in == 0,
                     memory_key_padding_mask=source == 0)
        loss = self.loss(self.output(h).reshape(-1, self.output.out_features), target.reshape(-1))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def build(name, hp, vocab_size, seed):
    """The yardstick `name` (one of NAMES) at hp's size; ImportError when torch is missing."""
    size = (vocab_size, hp.d_model, hp.d_ff, hp.num_blocks, hp.num_heads, hp.dropout_rate)
    if name in ("keras", "keras_bf16"):
        import keras
        keras.utils.set_random_seed(seed)
        before = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy("mixed_bfloat16" if name == "keras_bf16" else "float32")
        try:  # layers take the global policy when they are made
            return plain_keras(*size)
        finally:
            keras.mixed_precision.set_global_policy(before)
    if name == "torch":
        return TorchTransformer(*size, smoothing=hp.smoothing, seed=seed)
    raise ValueError(f"unknown yardstick {name!r}: choose from {', '.join(NAMES)}")


NAMES = {"keras": "plain Keras 3 (MultiHeadAttention, Dense), float32",
         "keras_bf16": "plain Keras 3, mixed_bfloat16",
         "torch": "PyTorch nn.Transformer, float32"}
