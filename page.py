"""Look inside a trained model in your browser: a page on this machine that translates what you
type and shows the finished hypotheses, the beam as a tree and every attention map.

    python page.py --preset sample
    python page.py --preset multi30k --compare log/multi30k_without_positions

Prints the page's address (http://127.0.0.1:8000/ unless --port says otherwise) and serves it
until Ctrl-C. The page asks for the sentence, the beam size and the length penalty; it shows the
translation (translate.py's for the same settings: a long text cut into parts as it cuts them),
the K finished hypotheses with their scores, the beam search step by step as a tree, and the
attention of the translation: over the source, the encoder's and the decoder's self-attention,
per layer and per head and their mean, as heat maps whose rows and columns are the pieces
(hovering or clicking a row lights up the columns it attends to). With --compare, another run
translates the same text beside it. Needs the optional group `page` (bash setup.sh page): Flask.
Nothing is fetched from outside the machine; by default only this machine can open the page.
"""
import errno
import os

import hyperparams
from support.utils import UserError, optional, run_cli
from trained.runs import Translator, run_settings

# The settings page.py reads (--help shows these): the rest come from <logdir>/hparams.json.
SETTINGS = (*hyperparams.DECODING, "beam_size", "alpha", "beam_stop")


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--port", type=int, default=8000,
                            help="the port to serve on (default 8000; 0: any free port, printed at start)")
        parser.add_argument("--host", default="127.0.0.1",
                            help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 "
                                 "opens the page to the network, with no password)")
        parser.add_argument("--compare", metavar="LOGDIR", action="append",
                            help="another run's folder, shown beside the first on the same text (repeatable)")
        parser.add_argument("--ckpt", metavar="PATH",
                            help="the .keras checkpoint file of the first run (default: the newest in "
                                 "<logdir>/ckpt, or the mean of the newest --average_last)")
    hp, args = run_settings(__doc__.split("\n\n")[0], argv, add_arguments, SETTINGS)
    compare = args.compare or []
    for folder in compare:
        if not os.path.isfile(os.path.join(folder, "hparams.json")):
            raise UserError(f"{folder}: not a training run (no hparams.json): give --compare the --logdir of a "
                            f"finished train.py")
    optional("flask", "page")  # before loading models: a missing group is said at once
    from werkzeug.serving import make_server

    from trained.web import make_app

    runs = [(hp.logdir, Translator(ckpt=args.ckpt, hp=hp, preset=args.preset_given))]
    runs += [(folder, Translator(folder)) for folder in compare]
    try:
        server = make_server(args.host, args.port, make_app(runs), threaded=True)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UserError(f"port {args.port} is in use: pass --port with another (0: any free port)") from None
        raise
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving {', '.join(name for name, _ in runs)} at http://{host}:{server.server_port}/ "
          f"(Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)


if __name__ == "__main__":
    run_cli(main)
