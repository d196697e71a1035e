"""What the benchmarks share: a command line with --preset, --seed, --prepro_dir and the model's size."""
import argparse
import dataclasses

import hyperparams
from support.utils import UserError

DEFAULT_PRESET = "multi30k"
# Hparams fields the benches take as options: where the data is, and the size and batch budget to bench
# the preset at.
FIELDS = ("prepro_dir", "d_model", "d_ff", "num_blocks", "num_heads", "attention_dropout", "output_vocab", "kernels",
          "tokens_per_batch", "weight_decay")


def parser(doc):
    """An ArgumentParser described by the first paragraph of doc, with the shared options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=hyperparams.HelpFormatter)
    p.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(hyperparams.PRESETS),
                   help=f"the settings to bench (values shown below: preset {DEFAULT_PRESET!r}'s)")
    p.add_argument("--seed", type=int, default=0, help="the benchmark's batches and weights")
    hyperparams.add_field_options(p, hyperparams.preset(DEFAULT_PRESET), FIELDS, accept_others=False)
    return p


def parse(p, argv):
    """(args, the preset's Hparams with the given --prepro_dir and size options applied).

    Only FIELDS: a bench's own --seed, --precision or --jit_compile share a name with an Hparams
    field but are the bench's settings, not the preset's.
    """
    args = p.parse_args(argv)
    hp = dataclasses.replace(hyperparams.preset(args.preset), **hyperparams.given_fields(args, FIELDS))
    try:
        hyperparams.validate(hp)
    except UserError as e:
        p.error(str(e))
    return args, hp
