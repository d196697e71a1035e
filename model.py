"""The Transformer: encoder and decoder stacks over one shared embedding matrix (or three, with
--share_embeddings 0).

`make_model(hp, vocab_size)` is the only place that reads hyperparameters; the layers in modules.py
take plain arguments. Shape letters as in modules.py.
"""
import contextlib
import dataclasses

import keras
import numpy as np
from keras import ops

from support import devices
from kernels import fast
import modules
from data_load import EOS, PAD, UNK
from modules import (PACKAGE, DecoderBlock, EncoderBlock, LabelSmoothedCrossEntropy, PositionalEncoding,
                     TokenEmbedding, WarmupInverseSqrt, WarmupLinearDecay)

# One pair (a word piece, </s>) as source and target: a call on it creates every weight.
BUILD_IDS = np.array([[4, EOS]], np.int32)
# The Hparams fields that travel in modules.Choices
CHOICE_FIELDS = tuple(f.name for f in dataclasses.fields(modules.Choices))


@keras.saving.register_keras_serializable(package=PACKAGE)
class Transformer(devices.DistributedTrainingFixes, keras.Model):
    """Encoder-decoder Transformer (section 3) for translation.

    Call it on (source ids (N, T1), decoder input ids (N, T2)); it returns logits (N, T2, V'): over
    every id (V' = V), or with output_ids (ascending, starting with the ids 0-3) over those ids
    alone, column j for id output_ids[j] (V' = len(output_ids)). decoding.py turns it into a
    translator: greedy decoding and beam search, returning ids either way.

    choices (modules.Choices or its dict) holds the details where the paper and the reference
    differ; kernels (an Hparams.kernels value: auto, plain, fast or a list) names the faster
    kernels the model is built with, resolved once into `kernels`, a fast.Choice: the primitives
    every layer is built with, the optimizer, beam search's cache layout. They are not part of the saved config: a
    checkpoint loads with whichever kernels are asked for (checkpoints.load: the run's --kernels;
    keras.models.load_model: plain). Nor is xla_decoding, whether TensorFlow compiles the decoding
    loops with XLA for each batch shape or runs them as one graph for all (decoding.compiled; the
    --jit_compile setting, support.devices.jit_compile; None: its auto choice), which also chooses
    how the loops write into the caches (fast.decoding_parts; `parts`: what the layers are built with).
    """

    def __init__(self, vocab_size, d_model, d_ff, num_blocks, num_heads, dropout_rate=0.1,
                 maxlen1=100, maxlen2=100, positional="sinusoid", output_ids=None, attention_dropout=None,
                 choices=None, kernels="plain", xla_decoding=None, **kwargs):
        super().__init__(**kwargs)
        if output_ids is not None:
            output_ids = [int(i) for i in output_ids]
            if output_ids[:4] != [0, 1, 2, 3] or sorted(set(output_ids)) != output_ids or output_ids[-1] >= vocab_size:
                raise ValueError("output_ids must be ascending ids below vocab_size, starting with 0, 1, 2, 3")
        self.output_ids = output_ids
        self.output_vocab = "all" if output_ids is None else "target"  # hyperparams.Hparams.output_vocab
        self.output_size = vocab_size if output_ids is None else len(output_ids)  # V'
        self.vocab_size, self.d_model, self.d_ff = vocab_size, d_model, d_ff
        self.num_blocks, self.num_heads, self.dropout_rate = num_blocks, num_heads, dropout_rate
        self.maxlen1, self.maxlen2, self.positional = maxlen1, maxlen2, positional
        self.attention_dropout = attention_dropout  # None: dropout_rate
        self.choices, self.kernels = modules.Choices.of(choices), fast.choose(kernels)
        self.xla_decoding = devices.jit_compile() if xla_decoding is None else bool(xla_decoding)
        self.graph_folder = None  # where decoding loops traced as one graph are kept (decoding.one_graph)
        # the parts every layer is built with: --kernels', and decoding's write as the loops run
        self.parts = parts = fast.decoding_parts(self.kernels.parts, self.xla_decoding)
        shared = self.choices.share_embeddings
        embedding = dict(pad_id=PAD, initializer=self.choices.embedding_init, scale=self.choices.scale_embeddings)
        # the target side's, and (shared, as in 3.4) the source's and the output projection's too
        self.embedding = TokenEmbedding(vocab_size, d_model, zero_pad_logit=self.choices.pad_logit == "zero",
                                        tied_output=shared, parts=parts, **embedding, name="embedding")
        self.source_embedding = None if shared else TokenEmbedding(vocab_size, d_model, **embedding,
                                                                   name="source_embedding")
        self.source_position = PositionalEncoding(d_model, maxlen1, positional, name="source_position")
        self.target_position = PositionalEncoding(d_model, maxlen2, positional, name="target_position")
        self.source_dropout = parts.Dropout(dropout_rate)
        self.target_dropout = parts.Dropout(dropout_rate)
        block = dict(attention_dropout=attention_dropout, choices=self.choices, parts=parts)
        self.encoder_blocks = [EncoderBlock(d_model, d_ff, num_heads, dropout_rate, **block, name=f"encoder_{i}")
                               for i in range(num_blocks)]
        self.decoder_blocks = [DecoderBlock(d_model, d_ff, num_heads, dropout_rate, **block, name=f"decoder_{i}")
                               for i in range(num_blocks)]
        # with the layer norms before each sublayer, each stack's output is normalized once at its end
        pre = self.choices.norm == "pre"
        epsilon = self.choices.layer_norm_epsilon
        self.encoder_norm = parts.LayerNormalization(epsilon=epsilon, name="encoder_norm") if pre else None
        self.decoder_norm = parts.LayerNormalization(epsilon=epsilon, name="decoder_norm") if pre else None

    def embed_source(self, source, training=None):
        """source (N, T1) ids -> the encoder's input (N, T1, d): embeddings, positions, dropout."""
        embedding = self.embedding if self.source_embedding is None else self.source_embedding
        x = self.source_position(embedding(source))  # (N, T1, d)
        return self.source_dropout(x, training=training)  # (N, T1, d)

    def embed_target(self, target_in, training=None, start=0):
        """target_in (N, T2) ids at positions start..start+T2-1 -> the decoder's input (N, T2, d)."""
        y = self.target_position(self.embedding(target_in), start=start)  # (N, T2, d)
        return self.target_dropout(y, training=training)  # (N, T2, d)

    def logits(self, y, output_matrix=None):
        """The last decoder block's output y (N, T2, d) -> logits (N, T2, V'): (pre-norm) the
        decoder's final layer norm, then the pre-softmax linear layer over output_ids' rows
        (output_matrix(), or the one given)."""
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)  # (N, T2, d)
        return self.embedding.project(y, self.output_rows(), matrix=output_matrix)  # (N, T2, V')

    def output_matrix(self):
        """The pre-softmax linear layer's matrix over the logits columns (V', d) in the compute
        dtype: its rows of output_ids gathered, and cast, once. A decoding loop takes it before its
        steps (decode_step's output_matrix), not at every step."""
        return ops.cast(self.embedding.output_matrix(self.output_rows()), self.embedding.compute_dtype)  # (V', d)

    def encode(self, source, training=None, return_attention_scores=False):
        """source (N, T1) ids -> memory (N, T1, d), source mask (N, T1) bool; with
        return_attention_scores also each block's self-attention weights, a list of (N, h, T1, T1)."""
        source_mask = ops.not_equal(source, PAD)  # (N, T1)
        x = self.embed_source(source, training=training)  # (N, T1, d)
        scores = []
        for block in self.encoder_blocks:
            x, weights = block(x, source_mask, training=training, return_attention_scores=True)  # (N, T1, d)
            scores.append(weights)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)  # (N, T1, d)
        return (x, source_mask, scores) if return_attention_scores else (x, source_mask)

    def decode(self, target_in, memory, source_mask, training=None, return_attention_scores=False):
        """target_in (N, T2) ids, memory (N, T1, d) -> logits (N, T2, V'): every position at once
        (training, and the reference's decoding); with return_attention_scores also each block's
        (self-attention, cross-attention) weights, a list of ((N, h, T2, T2), (N, h, T2, T1))."""
        target_mask = ops.not_equal(target_in, PAD)  # (N, T2)
        y = self.embed_target(target_in, training=training)  # (N, T2, d)
        y, _, scores = self.decoder_stack(y, target_mask, source_mask, memory=memory, training=training)  # (N, T2, d)
        logits = self.logits(y)  # (N, T2, V')
        return (logits, scores) if return_attention_scores else logits

    def decoder_stack(self, y, target_mask, source_mask, memory=None, training=None, cross_caches=None, caches=None,
                      cache_index=None):
        """The decoder blocks in turn, over every position (memory given) or over new positions with
        caches (cross_caches and caches given, as decode_step passes them): y (N, T2, d) ->
        (N, T2, d), the blocks' updated self-attention caches (None without), and each block's
        (self-attention, cross-attention) weights."""
        new_caches, scores = [], []
        for i, block in enumerate(self.decoder_blocks):
            out = block(y, memory, target_mask, source_mask, training=training,
                        self_cache=None if caches is None else caches[i],
                        cross_cache=None if cross_caches is None else cross_caches[i], cache_index=cache_index,
                        return_attention_scores=True)  # (N, T2, d)[, cache], self weights, cross weights
            y, weights = out[0], out[-2:]
            if caches is not None:
                new_caches.append(out[1])
            scores.append(tuple(weights))
        return y, (new_caches if caches is not None else None), scores

    # Decoding one position a step: the same pass as decode's, the earlier keys and values kept

    def start_cache(self, source, length, repeat=1):
        """Encode once and make what decode_step reads and updates.

        Args:
          source: (N, T1) ids.
          length: L, the most entries each self-attention cache takes (the whole cache from the
            start, or none yet, as its layout keeps them: the model's parts.cache).
          repeat: K, decoding rows per sentence (beam search's hypotheses), adjacent.

        Returns:
          (context, caches), each with N*K rows. context, read at every step: "cross", per decoder
          block the encoder output's keys and values, each (N*K, h, T1, d_k), computed once; and
          "source_mask" (N*K, T1). caches, updated at every step: per decoder block an empty
          self-attention cache, keys and values each (N*K, h, L, d_k) (or (N*K, h, 0, d_k)).
        """
        memory, source_mask = self.encode(source, training=False)  # (N, T1, d)
        cross = [tuple(ops.repeat(t, repeat, axis=0) for t in block.cross_attention.keys_values(memory))
                 for block in self.decoder_blocks]  # (N*K, h, T1, d_k) each
        shape = (ops.shape(memory)[0] * repeat, self.num_heads, length, self.d_model // self.num_heads)
        caches = [(self.parts.cache.empty(*shape, memory.dtype), self.parts.cache.empty(*shape, memory.dtype))
                  for _ in self.decoder_blocks]  # (N*K, h, L, d_k) each, as the layout keeps them (Parts.cache)
        return {"cross": cross, "source_mask": ops.repeat(source_mask, repeat, axis=0)}, caches

    def decode_step(self, tokens, step, context, caches, target_mask=None, group=1, output_matrix=None,
                    cache_index=None):
        """decode for one new position: the previous tokens (N*G,) at position `step` -> the next
        token's logits over the logits columns (N*G, V'), float32 (a search takes the log-softmax at
        the columns it chooses: decoding.best_log_probs), and the updated caches (context and caches
        from start_cache; output_matrix from output_matrix(), taken here if None).

        By default (G = 1) every row has its own cache and sees its entries 0..step. With group G,
        the G adjacent rows of a sentence share one cache (a search's layout): they enter the
        decoder blocks as G queries of one row, all at position `step`, write entries
        step*G..step*G+G-1 (from cache_index, where the layout says otherwise), and target_mask
        (N, G, L) says which entries each may see. So the cache index the blocks get is an entry,
        not a position: the position reaches the model through embed_target's start alone.
        """
        if target_mask is None:  # entries 0..step
            entries = ops.arange(self.cache_entries(caches, group))  # (L,)
            target_mask = ops.expand_dims(ops.less_equal(entries, step), 0)  # (1, L)
        y = self.embed_target(ops.expand_dims(tokens, 1), training=False, start=step)  # (N*G, 1, d)
        y = ops.reshape(y, (-1, group, self.d_model))  # (N, G, d)
        y, caches, _ = self.decoder_stack(y, target_mask, context["source_mask"], cross_caches=context["cross"],
                                          caches=caches,
                                          cache_index=step * group if cache_index is None else cache_index)  # (N, G, d)
        y = ops.reshape(y, (-1, 1, self.d_model))  # (N*G, 1, d)
        return ops.cast(self.logits(y, output_matrix)[:, 0], "float32"), caches  # (N*G, V')

    def cache_entries(self, caches, group=1):
        """The entries each self-attention cache of caches holds once a step has written group
        more (L, however many are written, or as many as are written, as the layout keeps them):
        the length of a mask over them."""
        return self.parts.cache.entries(caches[0][0], group)

    def sublayers(self):
        """Every block's sublayers in order, each with its residual-and-norm: (stack, "encoder" or
        "decoder"; the block's index; its name, "self_attention", "cross_attention" or
        "feed_forward"; the sublayer; its AddNorm). The one walk of the blocks for code that maps
        the weights to another program's (trained/serving.py, reference_bridge/weights.py)."""
        for stack, blocks in (("encoder", self.encoder_blocks), ("decoder", self.decoder_blocks)):
            for i, block in enumerate(blocks):
                for name in block.SUBLAYERS:
                    yield stack, i, name, getattr(block, name), getattr(block, f"{name}_norm")

    def output_rows(self):
        """The ids that logits columns stand for, (V',) int32, or None for every id."""
        return None if self.output_ids is None else ops.convert_to_tensor(np.asarray(self.output_ids, np.int32))

    def to_ids(self, columns):
        """Logits columns (any shape, int32) -> the ids they stand for."""
        return columns if self.output_ids is None else ops.take(self.output_rows(), columns)

    def label_map(self):
        """Each id's logits column (V,) for the loss; ids outside output_ids count as <unk>.
        None when the logits cover every id."""
        if self.output_ids is None:
            return None
        columns = np.full(self.vocab_size, UNK, np.int32)
        columns[self.output_ids] = np.arange(len(self.output_ids))
        return columns

    def setting(self, name):
        """The value of the hyperparams.Hparams field `name` (a MODEL_FIELDS one) this model was built with."""
        return getattr(self.choices, name) if name in CHOICE_FIELDS else getattr(self, name)

    def call(self, inputs, training=None):
        source, target_in = inputs  # (N, T1), (N, T2)
        memory, source_mask = self.encode(source, training=training)  # (N, T1, d)
        return self.decode(target_in, memory, source_mask, training=training)  # (N, T2, V)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "d_ff": self.d_ff, "num_blocks": self.num_blocks, "num_heads": self.num_heads,
                "dropout_rate": self.dropout_rate, "maxlen1": self.maxlen1, "maxlen2": self.maxlen2,
                "positional": self.positional, "output_ids": self.output_ids,
                "attention_dropout": self.attention_dropout, "choices": dataclasses.asdict(self.choices)}

    @classmethod
    def from_config(cls, config):
        """The model a config describes, every layer in its dtype policy (a checkpoint trained in
        mixed precision computes in it again); also the configs of checkpoints written before the
        choices were one record (each a key)."""
        config = dict(config)
        old = {name: config.pop(name) for name in CHOICE_FIELDS if name in config}
        if old:
            config["choices"] = {**(config.get("choices") or {}), **old}
        with made_in(config.get("dtype")):
            return cls(**config)

    def build_from_config(self, config):
        self.build_with_dummy()

    def get_build_config(self):
        return {"built_by": "build_with_dummy"}  # non-empty: Keras only builds on load when truthy

    def build_with_dummy(self):
        """Create every weight by calling the model once on a tiny batch."""
        self((BUILD_IDS, BUILD_IDS), training=False)


def make_model(hp, vocab_size, output_ids=None):
    """The Transformer of hp's settings over a vocabulary of vocab_size, built with hp.kernels' choice
    (fast.choose); its logits cover output_ids (data_load.output_ids(hp.output_vocab, training
    targets)), or every id if None."""
    model = Transformer(vocab_size=vocab_size, d_model=hp.d_model, d_ff=hp.d_ff,
                        num_blocks=hp.num_blocks, num_heads=hp.num_heads,
                        dropout_rate=hp.dropout_rate, maxlen1=hp.maxlen1, maxlen2=hp.maxlen2,
                        positional=hp.positional, output_ids=output_ids,
                        attention_dropout=None if hp.attention_dropout < 0 else hp.attention_dropout,
                        choices={name: getattr(hp, name) for name in CHOICE_FIELDS}, kernels=hp.kernels,
                        xla_decoding=devices.jit_compile(hp), name="transformer")
    model.build_with_dummy()
    return model


def rebuild(model, kernels=None, dtype=None, xla_decoding=None):
    """The same model (its config and weights) built again with another --kernels' parts, in
    another dtype policy (e.g. "float32" for a model trained in mixed precision, whose weights are
    float32 already) or decoding with XLA or not (xla_decoding; None: as model does): a second
    model, the first left as it was."""
    config = model.get_config()
    config["xla_decoding"] = model.xla_decoding if xla_decoding is None else xla_decoding
    if kernels:
        config["kernels"] = kernels
    if dtype:
        config["dtype"] = dtype
    twin = Transformer.from_config(config)
    twin.build_with_dummy()
    twin.graph_folder = model.graph_folder
    twin.set_weights(model.get_weights())
    return twin


@contextlib.contextmanager
def made_in(dtype):
    """Layers made inside take the dtype policy dtype (a name, a keras.DTypePolicy or its config;
    None: the global one, as outside). A Keras layer's own dtype covers its weights and its
    computation, not the layers it makes: those take the global policy when they are made."""
    previous = keras.config.dtype_policy()
    if dtype is not None:
        keras.config.set_dtype_policy(keras.dtype_policies.get(dtype))
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def learning_rate(hp, total_steps=None):
    """hp.lr_decay's schedule: warmup, then inverse-sqrt decay (section 5.3, the reference's) or a
    linear decay that reaches 0 after total_steps (the training steps of hp.num_epochs epochs)."""
    if hp.lr_decay == "rsqrt":
        return WarmupInverseSqrt(hp.lr, hp.warmup_steps)
    if not total_steps:
        raise ValueError("--lr_decay linear needs the number of training steps")
    return WarmupLinearDecay(hp.lr, hp.warmup_steps, total_steps)


class SkipNonfinite:
    """Mixin for a Keras optimizer: it leaves out an update whose gradients are not all finite.

    A skipped batch changes no weight, no moment and no learning-rate step; `skipped_steps`
    counts them. train.py uses it with --skip_nonfinite 1 (a NaN/Inf batch otherwise stops training).
    Its state is saved in the layout of the optimizer without it (the count travels in the
    checkpoint's training state), so that a run resumes with --skip_nonfinite changed either way
    with its Adam moments and step.
    """

    def build(self, var_list):
        super().build(var_list)
        self.skipped_steps = self.add_variable((), initializer="zeros", dtype="int32", name="skipped_steps")

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            self.build(trainable_variables)
        finite = ops.all(ops.stack([ops.all(ops.isfinite(g)) for g in grads if g is not None]))

        def update():
            super(SkipNonfinite, self).apply(grads, trainable_variables)

        def skip():
            self.skipped_steps.assign_add(1)

        ops.cond(finite, update, skip)

    def adam_variables(self):
        """Every variable but the count: the variables of the optimizer without this mixin, in order."""
        return [v for v in self.variables if v is not self.skipped_steps]

    def save_own_variables(self, store):
        for i, variable in enumerate(self.adam_variables()):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store):
        """The plain layout; or one with the count last (checkpoints written before that layout)."""
        own = self.adam_variables()
        if len(store.keys()) == len(own) + 1:
            self.skipped_steps.assign(store[str(len(own))])
        elif len(store.keys()) != len(own):
            return super().load_own_variables(store)  # Keras' warning; checkpoints.restore refuses it
        for i, variable in enumerate(own):
            variable.assign(store[str(i)])


@keras.saving.register_keras_serializable(package=PACKAGE)
class GuardedAdam(SkipNonfinite, keras.optimizers.Adam):
    """Keras' Adam that leaves out non-finite updates (--skip_nonfinite 1)."""


def loss_function(model, hp):
    """Label-smoothed cross-entropy over non-pad tokens (section 5.4), the loss training minimizes."""
    return LabelSmoothedCrossEntropy(hp.smoothing, pad_id=PAD, label_map=model.label_map(),
                                     token_count=devices.mean_over_replicas, parts=model.kernels.parts)


def compile_model(model, hp, total_steps=None):
    """Adam (beta1 0.9; beta2 and eps hp.adam_beta2 and hp.adam_epsilon: 0.98 and 1e-9 in section
    5.3, 0.999 and 1e-8 in the reference) with warmup and hp.lr_decay's decay
    (learning_rate) and hp.weight_decay (Keras' decoupled decay, as AdamW; 0: none), and
    loss_function's loss. With hp.skip_nonfinite,
    updates whose gradients are not finite are left out (SkipNonfinite, over Keras' own Adam)."""
    adam = GuardedAdam if hp.skip_nonfinite else model.kernels.optimizer
    optimizer = adam(learning_rate=learning_rate(hp, total_steps), beta_1=0.9, beta_2=hp.adam_beta2,
                     epsilon=hp.adam_epsilon, weight_decay=hp.weight_decay or None)
    model.compile(optimizer=optimizer, loss=loss_function(model, hp),
                  jit_compile=devices.jit_compile(hp))
    # Build the compiled loss and the optimizer now (see devices.DistributedTrainingFixes).
    model.compute_loss(x=(BUILD_IDS, BUILD_IDS), y=BUILD_IDS, y_pred=model((BUILD_IDS, BUILD_IDS)), training=False)
    model.optimizer.build(model.trainable_variables)
    return model


def compile_for_loss(model, hp):
    """The model compiled for loss_per_token alone (eval.py): the training loss, no optimizer and so
    no learning-rate schedule (a linear decay's length is known only to training)."""
    model.compile(loss=loss_function(model, hp), jit_compile=devices.jit_compile(hp))
    return model


def loss_per_token(model, batches):
    """The compiled model's loss over every real (non-pad) target token of batches [((x, d), y)].
    Each batch's loss is the mean over its own real tokens, so the batches weigh as many tokens as
    they hold: a plain mean of the batch means would count a short last batch like a full one."""
    if not batches:  # no pair of the split fits maxlen1/maxlen2
        return float("nan")
    losses = [float(ops.convert_to_numpy(model.test_on_batch(x, y))) for x, y in batches]
    tokens = [int(np.count_nonzero(np.asarray(y) != PAD)) for _, y in batches]
    return float(np.average(losses, weights=tokens))
