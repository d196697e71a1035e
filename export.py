"""Export a trained model to run without this project: a TensorFlow SavedModel or a CTranslate2 model.

    python export.py --preset sample --format saved_model --output exported/sample
    python export.py --preset multi30k --format ctranslate2 --output exported/multi30k-ct2
    python export.py --preset multi30k --format ctranslate2 --quantization int8 --output exported/int8

saved_model: a folder for tf.saved_model.load and TensorFlow Serving. Its `translate` function (also
the `serving_default` signature) takes a 1-D string tensor of sentences and returns a 1-D string
tensor of translations: the sentencepiece model runs inside the graph (tensorflow-text; `import
tensorflow_text` before loading registers its ops), then cached greedy decoding; a line longer than
the model's maxlen1 is cut into pieces and their translations joined, as translate.py does.

    import tensorflow as tf, tensorflow_text  # noqa: F401
    translator = tf.saved_model.load("exported/sample")
    translator.translate(tf.constant(["Ein Mann fährt Fahrrad."]))

ctranslate2: a CTranslate2 model folder (float32, or int8 weights with --quantization int8) with the
sentencepiece model beside it as sentencepiece.model. CTranslate2 takes pieces, not text:

    import ctranslate2, sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file="exported/multi30k-ct2/sentencepiece.model")
    translator = ctranslate2.Translator("exported/multi30k-ct2")
    out = translator.translate_batch([sp.encode("Ein Mann fährt Fahrrad.", out_type=str)], beam_size=1)
    sp.decode(out[0].hypotheses[0])

The weights are the Transformer's as trained; what CTranslate2 has no setting for is written into
them: the model's logits cover only the training targets' pieces (--output_vocab target) and
decoding never chooses <pad> or <s> (decoding.bar_tokens), so those ids get an output bias of -1e9;
a model without W^O (the reference's) gets the identity in its place. The converted model must
score a few made-up sentence pairs as the model does (in float32, as CTranslate2 computes: a model
trained in mixed precision is checked computing in float32), or nothing is written: a model CTranslate2
cannot hold (another activation, a layer of your own) is refused; saved_model runs any model.
"""
import os
import shutil
import tempfile

import hyperparams
from trained.runs import Translator, run_settings
from trained.serving import export_ctranslate2, export_saved_model
from support.utils import UserError, run_cli

# The settings export.py reads (--help shows these): the rest come from <logdir>/hparams.json.
SETTINGS = hyperparams.DECODING
FORMATS = ("saved_model", "ctranslate2")


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--format", required=True, choices=FORMATS, help="what to write")
        parser.add_argument("--output", metavar="DIR", required=True, help="the folder to write (must not exist "
                                                                           "unless --force)")
        parser.add_argument("--quantization", choices=("int8", "int8_float32", "int16", "float16"),
                            help="ctranslate2: weight type (default: float32)")
        parser.add_argument("--force", action="store_true", help="replace --output if it exists")
        parser.add_argument("--ckpt", metavar="PATH",
                            help="the .keras checkpoint file to export (default: the newest in "
                                 "<logdir>/ckpt, or the mean of the newest --average_last)")
    hp, args = run_settings(__doc__.split("\n\n")[0], argv, add_arguments, SETTINGS)
    if args.quantization and args.format != "ctranslate2":
        raise UserError("--quantization is for --format ctranslate2")
    output = os.path.abspath(args.output)
    if os.path.exists(output) and not args.force:
        raise UserError(f"{args.output} exists; pass --force to replace it, or choose another --output")
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    translator = Translator(ckpt=args.ckpt, hp=hp, preset=args.preset_given)
    work = tempfile.mkdtemp(prefix=".tmp-export-", dir=parent)  # the folder appears once complete
    try:
        target = os.path.join(work, "model")
        if args.format == "ctranslate2":
            export_ctranslate2(translator, target, args.quantization)
        else:
            export_saved_model(translator, target)
        if os.path.exists(output):
            shutil.rmtree(output)
        os.replace(target, output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.output} ({args.format}{', ' + args.quantization if args.quantization else ''}) "
          f"from {translator.ckpt}")


if __name__ == "__main__":
    run_cli(main)
