"""Exporting a trained model to run without this project: the CTranslate2 specification of its
weights, and a TensorFlow SavedModel that translates text in one graph. export.py is the command
line over this; its help says how to use what it writes. Keras and the project's modules built on
it are imported inside the functions, so that export.py's --help stays quick and quiet.
"""
import dataclasses
import os
import re

import numpy as np

from support.utils import UserError, optional

# Rows of the sinusoid table given to CTranslate2, which reads positions from a table: the longest
# sentence it can take or write
SINUSOID_ROWS = 1024
# Each of the model's choices (modules.Choices), and where the CTranslate2 specification has it: a
# choice added to modules.Choices and not here makes the export refuse, rather than guess
CHOICES_WRITTEN = {
    "attention_output": "W^O, or the identity in its place",
    "residual_dropout": "training only",
    "layer_norm_epsilon": "the model's layer_norm_epsilon",
    "embedding_init": "training only",
    "pad_logit": "the output matrix, its <pad> row zeroed",
    "norm": "pre_norm, and each stack's final layer norm",
    "scale_embeddings": "scale_embeddings",
    "share_embeddings": "the encoder's own embeddings and the output matrix",
}
# Each sublayer of a block (model.Transformer.sublayers) and its place in a CTranslate2 layer
CTRANSLATE2_NAMES = {"self_attention": "self_attention", "cross_attention": "attention", "feed_forward": "ffn"}
# The feed-forward activations CTranslate2 has, by Keras name
ACTIVATIONS = ("relu", "gelu")
# How far a token's log-probability may differ between CTranslate2 (float32) and the model
SCORE_TOLERANCE = 1e-3


# CTranslate2: the weights in its Transformer specification

def _linear(spec, kernel, bias):
    """A Keras kernel (in, out) and bias (out,) into a CTranslate2 linear layer (out, in)."""
    spec.weight = np.ascontiguousarray(np.asarray(kernel, np.float32).T)
    spec.bias = np.asarray(bias, np.float32)


def _norm(spec, norm):
    """A LayerNormalization into CTranslate2's."""
    spec.gamma = np.asarray(norm.gamma, np.float32)
    spec.beta = np.asarray(norm.beta, np.float32)


def _attention(spec, mha, self_attention):
    """A MultiHeadAttention into CTranslate2's: Q, K and V fused for self-attention, K and V for
    attention over the encoder output; W^O, or the identity for a model without it."""
    parts = [(np.asarray(d.kernel), np.asarray(d.bias)) for d in (mha.query_dense, mha.key_dense, mha.value_dense)]
    if self_attention:
        _linear(spec.linear[0], np.concatenate([k for k, _ in parts], 1), np.concatenate([b for _, b in parts]))
    else:
        _linear(spec.linear[0], *parts[0])
        _linear(spec.linear[1], np.concatenate([k for k, _ in parts[1:]], 1),
                np.concatenate([b for _, b in parts[1:]]))
    out = spec.linear[-1]
    if mha.output_dense is not None:
        _linear(out, np.asarray(mha.output_dense.kernel), np.asarray(mha.output_dense.bias))
    else:
        _linear(out, np.eye(mha.d_model, dtype=np.float32), np.zeros(mha.d_model, np.float32))


def _feed_forward(spec, ffn):
    _linear(spec.linear_0, np.asarray(ffn.inner.kernel)[0], np.asarray(ffn.inner.bias))  # (1, d, f) -> (d, f)
    _linear(spec.linear_1, np.asarray(ffn.outer.kernel)[0], np.asarray(ffn.outer.bias))


def _positions(model, layer):
    from keras import ops

    from modules import sinusoid
    if model.positional == "learned":
        return np.asarray(layer.table, np.float32)
    if model.positional == "none":  # CTranslate2 adds a table: one of zeros adds nothing
        return np.zeros((max(SINUSOID_ROWS, layer.maxlen), model.d_model), np.float32)
    return np.asarray(ops.convert_to_numpy(sinusoid(max(SINUSOID_ROWS, layer.maxlen), model.d_model)), np.float32)


def refuse_what_ctranslate2_cannot_hold(model):
    """A UserError naming the first part of the model that CTranslate2's Transformer has no place
    for: a choice this file does not know, another activation, or a layer of another class than
    modules.py's (a replaced one); else the feed-forward activation's name."""
    import modules

    def refuse(what):
        raise UserError(f"--format ctranslate2 cannot export this model: {what}; --format saved_model "
                        f"runs the model's own layers")

    unknown = [f.name for f in dataclasses.fields(model.choices) if f.name not in CHOICES_WRITTEN]
    if unknown:
        refuse(f"the setting {unknown[0]} has no place in CTranslate2's specification (serving.CHOICES_WRITTEN)")
    if model.positional not in modules.POSITIONAL_KINDS:
        refuse(f"positional {model.positional!r}")
    for block, kind in [(b, modules.EncoderBlock) for b in model.encoder_blocks] + [
            (b, modules.DecoderBlock) for b in model.decoder_blocks]:
        if type(block) is not kind:
            refuse(f"{block.path} is a {type(block).__name__}, not modules.{kind.__name__}")
    activations = set()
    for _, _, name, layer, _ in model.sublayers():
        expected = modules.FeedForward if name == "feed_forward" else modules.MultiHeadAttention
        if type(layer) is not expected:
            refuse(f"{layer.path} is a {type(layer).__name__}, not modules.{expected.__name__}")
        if name != "feed_forward":
            continue
        activation = layer.inner.activation.__name__
        if activation not in ACTIVATIONS or layer.outer.activation.__name__ != "linear":
            refuse(f"{layer.path.rsplit('/', 1)[0]}'s feed-forward activation is {activation}; CTranslate2 has "
                   f"{' and '.join(ACTIVATIONS)}")
        activations.add(activation)
    if len(activations) > 1:
        refuse(f"its blocks use {' and '.join(sorted(activations))}; CTranslate2 has one activation")
    return activations.pop()


def ctranslate2_spec(model, pieces):
    """The CTranslate2 TransformerSpec of a trained Transformer (absolute positions; the layer
    norms after or before each sublayer, the embeddings scaled or not, shared or not, as the model
    has them) over the vocabulary pieces (a list: id -> piece); a UserError for a model it cannot
    hold (refuse_what_ctranslate2_cannot_hold)."""
    transformer_spec = optional("ctranslate2.specs.transformer_spec", "export")
    common_spec = optional("ctranslate2.specs.common_spec", "export")
    from keras import ops

    import data_load
    from modules import NEG_INF  # a logit that never wins

    activation = refuse_what_ctranslate2_cannot_hold(model)
    pre = model.choices.norm == "pre"
    spec = transformer_spec.TransformerSpec.from_config(
        model.num_blocks, model.num_heads, pre_norm=pre,
        activation=getattr(common_spec.Activation, activation.upper()))
    source_embedding = model.embedding if model.source_embedding is None else model.source_embedding
    for side, embedding, position in ((spec.encoder, source_embedding, model.source_position),
                                      (spec.decoder, model.embedding, model.target_position)):
        weight = np.asarray(embedding.embeddings, np.float32)  # (V, d)
        (side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings).weight = weight
        side.scale_embeddings = bool(embedding.scale)  # times sqrt(d), as TokenEmbedding
        side.position_encodings.encodings = _positions(model, position)
    layers = {"encoder": spec.encoder.layer, "decoder": spec.decoder.layer}
    for stack, i, name, sublayer, add_norm in model.sublayers():
        place = getattr(layers[stack][i], CTRANSLATE2_NAMES[name])
        if name == "feed_forward":
            _feed_forward(place, sublayer)
        else:
            _attention(place, sublayer, name == "self_attention")
        _norm(place.layer_norm, add_norm.norm)
    if pre:  # each stack's final layer norm
        _norm(spec.encoder.layer_norm, model.encoder_norm)
        _norm(spec.decoder.layer_norm, model.decoder_norm)
    # the output layer: its matrix (the shared one unless --share_embeddings 0; the <pad> row zeroed
    # for --pad_logit zero), and a bias that rules out what the port's softmax does not cover or its
    # decoding never chooses
    bias = np.zeros(model.vocab_size, np.float32)
    if model.output_ids is not None:
        bias[:] = NEG_INF
        bias[model.output_ids] = 0.0
    bias[[data_load.PAD, data_load.BOS]] = NEG_INF
    spec.decoder.projection.weight = np.asarray(ops.convert_to_numpy(model.embedding.output_matrix()), np.float32)
    spec.decoder.projection.bias = bias
    spec.config.add_source_eos = True  # the encoder reads the pieces and </s>
    spec.config.layer_norm_epsilon = float(model.choices.layer_norm_epsilon)
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    return spec


def write_ctranslate2(model, pieces, output, quantization=None):
    """Write the CTranslate2 model folder of a Transformer over the vocabulary pieces (id -> piece),
    once it has scored as the model does (check_ctranslate2, in float32); a UserError if not."""
    ctranslate2 = optional("ctranslate2", "export")
    if model.compute_dtype != "float32":
        # CTranslate2 computes in float32 from the float32 weights: the model it is checked against
        # computes in float32 too (bfloat16's rounding moves a token's log-probability by about 1e-2)
        import model as transformer

        model = transformer.rebuild(model, dtype="float32")

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return ctranslate2_spec(model, pieces)

    Converter().convert(output, force=True)
    check_ctranslate2(model, pieces, output)
    if quantization:
        Converter().convert(output, quantization=quantization, force=True)


def check_ctranslate2(model, pieces, folder, sentences=4, seed=0):
    """A UserError unless the CTranslate2 model in folder gives each token of a few made-up
    sentence pairs the log-probability the model gives it (teacher forcing), within SCORE_TOLERANCE:
    whatever the specification could not say (an edited layer, a setting it misread) shows here."""
    ctranslate2 = optional("ctranslate2", "export")
    from keras import ops

    import data_load

    rng = np.random.default_rng(seed)
    choosable = [i for i in (model.output_ids or range(model.vocab_size)) if i > data_load.EOS]
    source = rng.integers(data_load.EOS + 1, model.vocab_size, (sentences, 9)).astype(np.int32)  # (S, 9)
    target = rng.choice(choosable, (sentences, 7)).astype(np.int32)  # (S, 7)
    (x, target_in), labels = data_load.training_arrays(source, target, multiple=1)  # (S, 10), (S, 8), (S, 8)
    logits = np.asarray(ops.convert_to_numpy(model((x, target_in), training=False)), np.float64)  # (S, 8, V')
    logits[..., [data_load.PAD, data_load.BOS]] = -np.inf  # as the exported output bias has them
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)  # (S, 8, V')
    columns = labels if model.output_ids is None else np.searchsorted(model.output_ids, labels)
    want = np.take_along_axis(log_probs, columns[..., None], -1)[..., 0]  # (S, 8)
    translator = ctranslate2.Translator(folder, device="cpu", compute_type="float32")
    scored = translator.score_batch([[pieces[i] for i in row] for row in source],
                                    [[pieces[i] for i in row] for row in target])
    got = np.array([result.log_probs for result in scored])  # (S, 8): the tokens and </s>
    gap = float(np.abs(got - want).max()) if got.shape == want.shape else np.inf
    if not gap <= SCORE_TOLERANCE:
        raise UserError(f"--format ctranslate2: the converted model does not score as this model does (a token's "
                        f"log-probability differs by {gap:.3g}): the model computes something CTranslate2's "
                        f"Transformer does not (an edited layer?); --format saved_model runs the model's own layers")


def export_ctranslate2(translator, output, quantization=None):
    """Write the CTranslate2 model folder output, with the sentencepiece model as sentencepiece.model."""
    sp = translator.sp
    write_ctranslate2(translator.model, [sp.id_to_piece(i) for i in range(sp.get_piece_size())], output,
                      quantization)
    with open(os.path.join(output, "sentencepiece.model"), "wb") as f:
        f.write(sp.serialized_model_proto())


# SavedModel: text in, text out, in one TensorFlow graph

def export_saved_model(translator, output):
    """Write a SavedModel to output whose `translate` (and `serving_default`) maps a 1-D string
    tensor of sentences to their greedy translations, as translate.py gives them: the same
    cleaning, a line longer than maxlen1 - 1 tokens cut by the same rule, the same length limit."""
    import keras
    import tensorflow as tf
    tf_text = optional("tensorflow_text", "export")

    import data_load
    from decoding import default_max_len, greedy_loop

    if keras.backend.backend() != "tensorflow":
        raise UserError("--format saved_model needs KERAS_BACKEND=tensorflow")
    model, sp = translator.model, translator.sp
    tokenizer = tf_text.SentencepieceTokenizer(model=sp.serialized_model_proto())
    vocabulary = tf.constant([sp.id_to_piece(i) for i in range(sp.get_piece_size())])  # (V,)

    def decode(source):
        max_len = default_max_len(model, tf.shape(source)[1])  # as translate.py decodes
        return greedy_loop(model, source, max_len, tf.constant(0), shrink=True)[0]  # (P, L), one graph: it shrinks

    def translate(sentences):
        text = data_load.clean_tensor(sentences)  # (N,) as translate.py cleans them
        # 1. each line's pieces of at most maxlen1 - 1 tokens (trained/lines.py's translate_lines), and </s>
        pieces, owner = split_long_tensor(tokenizer.tokenize(text), vocabulary, model.maxlen1 - 1)  # (P, None), (P,)
        eos = tf.RaggedTensor.from_tensor(tf.fill([pieces.nrows(), 1], data_load.EOS))  # (P, 1)
        source = tf.concat([pieces, eos], axis=1).to_tensor(default_value=data_load.PAD)  # (P, T)
        pad = tf.minimum(-tf.shape(source)[1] % data_load.PAD_MULTIPLE, model.maxlen1 - tf.shape(source)[1])
        source = tf.pad(source, [[0, 0], [0, pad]])  # (P, T1): padded as data_load.encoder_inputs, not past maxlen1
        # 2. greedy decoding, every piece in one batch (no piece: nothing to decode)
        ids = tf.cond(tf.shape(source)[0] > 0, lambda: decode(source), lambda: tf.zeros([0, 1], tf.int32))
        keep = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, data_load.EOS), tf.int32), axis=1), 0)  # before </s>
        words = tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))  # (P,)
        # 3. each line's pieces joined, as translate_lines joins them; an empty line stays empty
        said = tf.not_equal(words, "")
        lines = tf.RaggedTensor.from_value_rowids(tf.boolean_mask(words, said), tf.cast(tf.boolean_mask(owner, said),
                                                  tf.int64), nrows=tf.shape(text, out_type=tf.int64)[0])  # (N, None)
        return tf.strings.strip(tf.strings.reduce_join(lines, axis=1, separator=" "))  # (N,)

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(tokenizer)
    signature = [tf.TensorSpec([None], tf.string, name="sentences")]
    archive.add_endpoint("translate", translate, input_signature=signature)
    archive.add_endpoint("serving_default", translate, input_signature=signature)
    archive.write_out(output, verbose=False)


def split_long_tensor(ids, vocabulary, max_tokens):
    """split_long in TensorFlow ops, for a graph that takes text (trained/serving.py's SavedModel), over
    every line at once: ids a ragged (N, None) int32 tensor of each line's token ids (no </s>),
    vocabulary the (V,) string tensor of the pieces -> (the pieces, a ragged (P, None) tensor of
    ids; the line each came from (P,), in order). An empty line gives no piece.
    tests/test_export.py checks that the two agree."""
    import tensorflow as tf

    from trained.lines import SENTENCE_END, WORD_START

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
