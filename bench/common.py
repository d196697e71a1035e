"""What the benchmarks share: a command line with --preset, --seed, --prepro_dir and the model's size."""
import argparse
import dataclasses

import hyperparams
from utils import UserError

DEFAULT_PRESET = "multi30k"
# Hparams fields the benches take as options: where the data is, and the size to bench the preset at.
FIELDS = ("prepro_dir", "d_model", "d_ff", "num_blocks", "num_heads", "output_vocab", "kernels")


def parser(doc):
    """An ArgumentParser described by the first paragraph of doc, with the shared options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(hyperparams.PRESETS))
    p.add_argument("--seed", type=int, default=0, help="the benchmark's batches and weights")
    group = p.add_argument_group(f"the preset's settings to change (values shown: preset {DEFAULT_PRESET!r})")
    hyperparams.add_field_options(group, hyperparams.preset(DEFAULT_PRESET), FIELDS)
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
