"""See what the model attends to: translate one sentence and draw its attention weights as a PNG.

    python attention.py --preset sample --output attention.png "Ein Mann fährt Fahrrad."
    python attention.py --preset multi30k --output a.png --encoder "Zwei Hunde spielen im Schnee."

One heatmap for every layer and head of the decoder's attention over the encoder output (section
3.2.3, "encoder-decoder attention"): the source pieces along the bottom, the output pieces down
the side, each row the weights (summing to 1) with which that output piece was chosen. With
--encoder, the encoder's self-attention too, a row of heatmaps per layer below. Prints the
translation. The weights are those of the model translating the sentence: it is decoded first
(as the run decodes: greedy, or beam search where its --beam_size is above 1), then run once more
over its own output with every attention layer keeping its weights
(modules.MultiHeadAttention.keep_attention).
"""
import os

import hyperparams
from translate import Translator
from utils import UserError, atomic_write, run_cli

SETTINGS = ("prepro_dir", "model", "devices", "beam_size", "alpha", "logdir")


def attention_maps(translator, sentence, beam_size=None, alpha=None, encoder=False):
    """Translate sentence and record the attention weights that produced it, decoding as the
    translator's settings say (beam_size, alpha: otherwise).

    Returns:
      (source pieces, output pieces (</s> included), translation, maps): maps a list of
      (layer's name, weights (h, Tq, Tk) numpy array, row pieces, column pieces), decoder cross-attention
      of every layer first, then (with encoder) the encoder self-attention of every layer.
    """
    import numpy as np
    from keras import ops

    import data_load
    from decoding import beam_search, greedy_decode
    from prepro import clean

    model, sp = translator.model, translator.sp
    beam_size = translator.hp.beam_size if beam_size is None else beam_size
    alpha = translator.hp.alpha if alpha is None else alpha
    text = clean(sentence)
    if not text:
        raise UserError("the sentence is empty: give the sentence to translate as the last argument")
    source_ids = sp.encode(text)
    if model.positional == "learned" and len(source_ids) + 1 > model.maxlen1:
        raise UserError(f"the sentence has {len(source_ids) + 1} tokens but this model takes at most maxlen1 "
                        f"{model.maxlen1}: give a shorter one")
    x = data_load.encoder_inputs([source_ids], multiple=1)  # (1, T1): the pieces and </s>
    ids = greedy_decode(model, x) if beam_size == 1 else beam_search(model, x, beam_size, alpha)
    out = [int(i) for i in ids[0] if i != data_load.PAD]  # the output pieces, </s> last
    target_in = np.array([[data_load.BOS] + out[:-1]], np.int32)  # (1, T2): what the decoder saw
    layers = [block.cross_attention for block in model.decoder_blocks]
    if encoder:
        layers += [block.self_attention for block in model.encoder_blocks]
    for layer in layers:
        layer.keep_attention = True
    try:
        model((x, target_in), training=False)  # eager: each layer keeps its weights
        weights = [ops.convert_to_numpy(layer.last_attention)[0] for layer in layers]  # (h, Tq, Tk) each
    finally:
        for layer in layers:
            layer.keep_attention, layer.last_attention = False, None
    source_pieces = [sp.id_to_piece(int(i)) for i in x[0]]
    output_pieces = [sp.id_to_piece(i) for i in out]
    n = len(model.decoder_blocks)
    maps = [(f"decoder {i + 1} (over the source)", w, output_pieces, source_pieces)
            for i, w in enumerate(weights[:n])]
    maps += [(f"encoder {i + 1} (self)", w, source_pieces, source_pieces)
             for i, w in enumerate(weights[n:])]
    translation = data_load.postprocess(sp, ids)[0]
    return source_pieces, output_pieces, translation, maps


def draw(maps, sentence, translation, output):
    """A grid of heatmaps, a row per layer and a column per head, written to the PNG file output."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no screen needed
    import matplotlib.pyplot as plt

    rows, heads = len(maps), maps[0][1].shape[0]
    size = max(max(len(r), len(c)) for _, _, r, c in maps)
    cell = max(2.4, 0.22 * size)
    fig, axes = plt.subplots(rows, heads, figsize=(cell * heads + 1, cell * rows + 1.2), squeeze=False)
    for (title, weights, row_pieces, column_pieces), axes_row in zip(maps, axes):
        for head, ax in enumerate(axes_row):
            ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(column_pieces)), column_pieces, rotation=90, fontsize=7)
            ax.set_yticks(range(len(row_pieces)), row_pieces, fontsize=7)
            ax.set_title(f"{title}, head {head + 1}", fontsize=8)
    fig.suptitle(f"{sentence}\n→ {translation}", fontsize=10)
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("sentence", help="the sentence to translate (quote it)")
        parser.add_argument("--output", metavar="PATH", required=True, help="the PNG file to write")
        parser.add_argument("--encoder", action="store_true",
                            help="also draw the encoder's self-attention, a row per layer")
        parser.add_argument("--ckpt", metavar="PATH", help="checkpoint (default: newest in <logdir>/ckpt)")
    hp, args, overrides = hyperparams.parse_args(__doc__.split("\n\n")[0], argv, add_arguments, show=SETTINGS)
    hp = hyperparams.settings_for_logdir(hp, overrides)
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise UserError(f"{args.output}: its folder {folder} does not exist; create it first")
    translator = Translator(ckpt=args.ckpt, hp=hp)
    _, _, translation, maps = attention_maps(translator, args.sentence, encoder=args.encoder)
    draw(maps, args.sentence, translation, args.output)
    print(translation)
    print(f"wrote {args.output}: {len(maps)} layers x {maps[0][1].shape[0]} heads")


if __name__ == "__main__":
    run_cli(main)
