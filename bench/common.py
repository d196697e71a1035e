"""What the benchmarks share: a command line with --preset, --prepro_dir, --seed and the model's size."""
import argparse

import hyperparams
from utils import UserError

SIZE_FIELDS = ("d_model", "d_ff", "num_blocks", "num_heads")  # to bench a preset at another size


def parser(doc):
    """An ArgumentParser described by the first paragraph of doc, with the shared options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="multi30k", choices=sorted(hyperparams.PRESETS))
    p.add_argument("--prepro_dir", help="prepro.py's output (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    for name in SIZE_FIELDS:
        p.add_argument(f"--{name}", type=int, help="the model's size (default: the preset's)")
    return p


def parse(p, argv):
    """(args, the preset's Hparams with --prepro_dir and the size options applied)."""
    args = p.parse_args(argv)
    hp = hyperparams.preset(args.preset)
    if args.prepro_dir:
        hp.prepro_dir = args.prepro_dir
    for name in SIZE_FIELDS:
        if getattr(args, name) is not None:
            setattr(hp, name, getattr(args, name))
    try:
        hyperparams.validate(hp)
    except UserError as e:
        p.error(str(e))
    return args, hp
