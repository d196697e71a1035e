"""The page of page.py: a Flask app that translates what is typed into it with one or more trained
runs and answers with everything the page draws (the translation, the finished hypotheses, the
beam as a tree, every attention map). The page itself is three static files in trained/web_files/;
all it shows is computed here, by the project's own model code.

Flask (the optional group `page`) is imported inside make_app, so that page.py's --help and the
core scripts do not need it.
"""
import base64
import os
import tempfile
import threading

import data_load
from support.utils import UserError
from trained.lines import split_long
from trained.runs import attention_maps, beam_trace

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web_files")
# The most characters the page takes at once (a paragraph or two: translate.py takes files)
MAX_CHARACTERS = 5000
# The beam sizes the page offers (the tree of a larger beam is too tall to read)
MAX_BEAM = 16


def missing_characters(sp, text):
    """The characters of text that the vocabulary has no piece for (each read as <unk>), in order."""
    seen = []
    for character in text:
        if not character.isspace() and character not in seen and sp.unk_id() in sp.encode(character):
            seen.append(character)
    return seen


def settings(body, hp):
    """(text, beam_size, alpha) of a request's JSON body, the run's own beam_size and alpha where
    the body has none; a UserError saying what to change for a value the page cannot use."""
    if not isinstance(body, dict):
        raise UserError('send JSON: {"text": "...", "beam_size": 4, "alpha": 0.6}')
    text = body.get("text", "")
    if not isinstance(text, str):
        raise UserError("the text must be a string")
    try:
        beam_size = int(body.get("beam_size", hp.beam_size))
        alpha = float(body.get("alpha", hp.alpha))
    except (TypeError, ValueError):
        raise UserError("the beam size must be a whole number and the length penalty a number") from None
    if not 1 <= beam_size <= MAX_BEAM:
        raise UserError(f"the beam size must be from 1 to {MAX_BEAM} (got {beam_size})")
    if not 0.0 <= alpha <= 5.0:
        raise UserError(f"the length penalty alpha must be from 0 to 5 (got {alpha:g})")
    return text, beam_size, alpha


def look(translator, text, beam_size, alpha):
    """What the page shows for one run and one text, as JSON-ready values.

    The translation is translator.translate's (what translate.py writes, a long text cut as it
    cuts it); the pictures are of the first piece of such a text, the whole text otherwise.

    Returns:
      dict of translation, notes (lines for the reader), source and output pieces, hypotheses
      (trained.runs.beam_trace's), tree (the beam as a PNG, base64) and maps: each a dict of
      kind (cross, encoder, decoder), layer (from 1), rows and columns (pieces) and heads (a
      list of rows x columns weights, the heads' mean last).
    """
    from support.pictures import draw_beam_tree

    sp, maxlen1 = translator.sp, translator.hp.maxlen1
    text = data_load.clean(text)
    if not text:
        raise UserError("there is nothing to translate: type a sentence")
    if len(text) > MAX_CHARACTERS:
        raise UserError(f"the text has {len(text)} characters, more than the {MAX_CHARACTERS} the page takes: "
                        f"translate a file with translate.py --input")
    notes = []
    missing = missing_characters(sp, text)
    if missing:
        notes.append(f"the vocabulary has no piece for {' '.join(missing)}: the model reads "
                     f"{'it' if len(missing) == 1 else 'each'} as <unk>")
    translation = translator.translate([text], beam_size, alpha)[0]
    parts = split_long(sp, text, maxlen1 - 1)
    if len(parts) > 1:
        notes.append(f"{sum(map(len, parts))} pieces, more than the {maxlen1 - 1} the model was trained on: "
                     f"translated in {len(parts)} parts, as translate.py does; the pictures show the first part")
    shown = sp.decode(parts[0])
    with tempfile.TemporaryDirectory() as folder:  # the tree is drawn by the project's own picture code
        tree, finished, hypotheses, ids = beam_trace(translator.model, sp, parts[0], beam_size, alpha,
                                                   translator.hp.beam_stop)
        with open(draw_beam_tree(tree, finished, os.path.join(folder, "beam.png")), "rb") as f:
            png = base64.b64encode(f.read()).decode("ascii")
    source_pieces, output_pieces, _, maps = attention_maps(translator, shown, beam_size, alpha, encoder=True,
                                                           decoder_self=True, ids=ids)  # the tree's output
    layers = len(maps) // 3
    kinds = ["cross"] * layers + ["encoder"] * layers + ["decoder"] * layers  # attention_maps' order
    return dict(
        translation=translation, notes=notes, source=source_pieces, output=output_pieces, shown=shown,
        hypotheses=hypotheses, tree=png,
        maps=[dict(kind=kind, layer=i % layers + 1, name=name, rows=rows, columns=columns,
                   heads=[h.round(4).tolist() for h in weights.astype("float64")]
                         + [weights.astype("float64").mean(axis=0).round(4).tolist()])
              for i, (kind, (name, weights, rows, columns)) in enumerate(zip(kinds, maps))])


def make_app(runs):
    """The Flask app of the page. runs: a list of (name, trained.runs.Translator), shown side by side.

    GET / is the page; GET /api/runs the runs' names and decoding settings; POST /api/translate
    takes {"text", "beam_size", "alpha"} and answers {"runs": [look(...) of each run]}, or
    {"error": one line} with status 400 (the input) or 500 (a fault here, whose traceback goes to
    the server's stderr); the server goes on serving after either. Each run is used by one request
    at a time (a lock each): requests that come together wait their turn and each gets its own
    answer.
    """
    from support.utils import optional

    flask = optional("flask", "page")
    from werkzeug.exceptions import HTTPException
    app = flask.Flask(__name__, static_folder=STATIC, static_url_path="/static")
    locks = [threading.Lock() for _ in runs]
    first = runs[0][1].hp

    @app.get("/")
    def index():
        return flask.send_from_directory(STATIC, "index.html")

    @app.get("/api/runs")
    def described():
        return dict(runs=[dict(name=name, beam_size=t.hp.beam_size, alpha=t.hp.alpha, maxlen1=t.hp.maxlen1)
                          for name, t in runs], max_beam=MAX_BEAM, max_characters=MAX_CHARACTERS)

    @app.post("/api/translate")
    def translated():
        try:
            text, beam_size, alpha = settings(flask.request.get_json(silent=True), first)
            answers = []
            for (name, translator), lock in zip(runs, locks):
                with lock:
                    answers.append(dict(name=name, **look(translator, text, beam_size, alpha)))
        except UserError as e:
            return dict(error=str(e)), 400
        return dict(runs=answers, beam_size=beam_size, alpha=alpha)

    @app.errorhandler(Exception)
    def fault(e):
        if isinstance(e, HTTPException):  # Flask's own answers: not found, wrong method
            return dict(error=f"{e.code} {e.name}: {e.description}"), e.code
        app.logger.exception("a request failed")
        first_line = str(e).splitlines()[0] if str(e) else ""
        return dict(error=f"the server failed on this input ({type(e).__name__}: {first_line}); its traceback "
                          f"is in the terminal that runs page.py"), 500

    return app
