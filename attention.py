"""See what the model attends to: translate one sentence and draw its attention weights as a PNG.

    python attention.py --preset sample --output attention.png "Ein Mann fährt Fahrrad."
    python attention.py --preset multi30k --output a.png --encoder "Zwei Hunde spielen im Schnee."

One heatmap for every layer and head of the decoder's attention over the encoder output (section
3.2.3, "encoder-decoder attention"): the source pieces along the bottom, the output pieces down
the side, each row the weights (summing to 1) with which that output piece was chosen. With
--encoder, the encoder's self-attention too, a row of heatmaps per layer below; with
--decoder_self, the decoder's (causal) self-attention, below those. Prints the
translation. The weights are those of the model translating the sentence: it is decoded first
(as the run decodes: greedy, or beam search where its --beam_size is above 1), then run once more
over its own output with every attention layer returning its weights (runs.attention_maps).
"""
import os

import hyperparams
from support.pictures import draw_attention
from trained.runs import Translator, attention_maps, run_settings
from support.utils import UserError, run_cli

# The settings attention.py reads (--help shows these): the rest come from <logdir>/hparams.json.
SETTINGS = (*hyperparams.DECODING, "beam_size", "alpha", "beam_stop")


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("sentence", help="the sentence to translate (quote it)")
        parser.add_argument("--output", metavar="PATH", required=True, help="the PNG file to write")
        parser.add_argument("--encoder", action="store_true",
                            help="also draw the encoder's self-attention, a row per layer")
        parser.add_argument("--decoder_self", action="store_true",
                            help="also draw the decoder's self-attention over its own output, a row per layer")
        parser.add_argument("--ckpt", metavar="PATH",
                            help="the .keras checkpoint file to draw with (default: the newest in "
                                 "<logdir>/ckpt, or the mean of the newest --average_last)")
    hp, args = run_settings(__doc__.split("\n\n")[0], argv, add_arguments, SETTINGS)
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise UserError(f"{args.output}: its folder {folder} does not exist; create it first")
    translator = Translator(ckpt=args.ckpt, hp=hp, preset=args.preset_given)
    _, _, translation, maps = attention_maps(translator, args.sentence, encoder=args.encoder,
                                          decoder_self=args.decoder_self)
    draw_attention(maps, args.sentence, translation, args.output)
    print(translation)
    kinds = ["decoder over the source"] + ["encoder self"] * args.encoder + ["decoder self"] * args.decoder_self
    print(f"wrote {args.output}: {len(kinds)} kind(s) of attention ({', '.join(kinds)}) x "
          f"{len(maps) // len(kinds)} layers x {maps[0][1].shape[0]} heads")


if __name__ == "__main__":
    run_cli(main)
