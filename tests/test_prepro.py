import gzip
import json
import os
import re

import numpy as np
import pytest

import hyperparams
import prepro
from conftest import ENGLISH, GERMAN, assert_one_line_error, run_script, write_parallel
from support.utils import UserError

TRAIN_DE = """<url>http://www.ted.com/talks/a.html</url>
<keywords>talks, science</keywords>
<speaker>Jane Doe</speaker>
<talkid>1</talkid>
<title>Eins</title>
<description>TED Talk: etwas</description>
Danke schön.
  Ein zweiter Satz.  
<reviewer href="x">R</reviewer>
<translator href="y">T</translator>
Dritter Satz & mehr.
"""
TRAIN_EN = """<url>http://www.ted.com/talks/a.html</url>
<keywords>talks, science</keywords>
<speaker>Jane Doe</speaker>
<talkid>1</talkid>
<title>One</title>
<description>TED Talk: something</description>
Thank you.
A second sentence.
<reviewer href="x">R</reviewer>
<translator href="y">T</translator>
Third sentence & more.
"""


def xml(segs, docs=1):
    body = "".join(f'<doc docid="{d}" genre="lectures">\n<title>t</title>\n' +
                   "".join(f'<seg id="{i + 1}"> {s} </seg>\n' for i, s in enumerate(segs)) + "</doc>\n"
                   for d in range(docs))
    return f'<mteval>\n<srcset setid="x" srclang="german">\n{body}</srcset>\n</mteval>\n'


def write(path, text, mode="w"):
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        f.write(text)
    return str(path)


def test_iwslt_train_tags_dropped(tmp_path):
    de = write(tmp_path / "train.tags.de-en.de", TRAIN_DE)
    en = write(tmp_path / "train.tags.de-en.en", TRAIN_EN)
    src, tgt = prepro.read_iwslt_train(de, en)
    assert src == ["Danke schön.", "Ein zweiter Satz.", "Dritter Satz & mehr."]
    assert tgt == ["Thank you.", "A second sentence.", "Third sentence & more."]


def test_iwslt_train_misaligned_tags(tmp_path):
    de = write(tmp_path / "a.de", "<url>u</url>\nHallo.\n")
    en = write(tmp_path / "a.en", "Hello.\n<url>u</url>\n")
    with pytest.raises(UserError, match=r"a\.(de|en):1: a tag line"):
        prepro.read_iwslt_train(de, en)


def test_iwslt_xml_entities_empty_segs_and_docs(tmp_path):
    de = write(tmp_path / "t.de.xml", xml(["Tom &amp; Jerry sagen &quot;hallo&quot; &lt;3", "", "Ende &#246;"], docs=2))
    en = write(tmp_path / "t.en.xml", xml(["Tom &amp; Jerry say &quot;hello&quot; &lt;3", "", "End"], docs=2))
    src, tgt = prepro.read_iwslt_pair(de, en)
    assert len(src) == len(tgt) == 6
    assert src[0] == 'Tom & Jerry sagen "hallo" <3' and src[2] == "Ende ö"
    assert src[1] == "" and tgt[1] == ""  # an empty seg keeps its place: pairs stay aligned
    assert tgt[0] == 'Tom & Jerry say "hello" <3'


def test_iwslt_xml_errors(tmp_path):
    de = write(tmp_path / "t.de.xml", xml(["a", "b", "c"]))
    en = write(tmp_path / "t.en.xml", xml(["a", "b"]))
    with pytest.raises(UserError, match="3 <seg> elements but .* has 2"):
        prepro.read_iwslt_pair(de, en)
    none = write(tmp_path / "none.xml", "<mteval><doc docid='1'></doc></mteval>")
    with pytest.raises(UserError, match=r"none\.xml: no <seg> elements"):
        prepro.read_iwslt_xml(none)
    cut = write(tmp_path / "cut.xml", xml(["a", "b", "c"])[:-40])
    with pytest.raises(UserError, match=r"cut\.xml:\d+: not well-formed XML"):
        prepro.read_iwslt_xml(cut)


def test_real_iwslt_2017_dev_and_test_sets():
    d = os.path.join(os.path.dirname(prepro.__file__), "..", "shared", "data", "iwslt2017-en-de")
    if not os.path.isdir(d):
        pytest.skip("../shared/data is not beside the project")
    for tst, n in (("tst2013", 993), ("tst2014", 1305)):
        src, tgt = prepro.read_iwslt_pair(os.path.join(d, f"IWSLT17.TED.{tst}.en-de.de.xml"),
                                          os.path.join(d, f"IWSLT17.TED.{tst}.en-de.en.xml"))
        assert len(src) == len(tgt) == n


def test_plain_files_gzip_and_errors(tmp_path):
    with gzip.open(tmp_path / "a.de.gz", "wt", encoding="utf-8") as f:
        f.write("Hallo Welt.\r\nZweite Zeile.\n")
    write(tmp_path / "a.en", "Hello world.\nSecond line.\n")
    assert prepro.read_parallel(str(tmp_path / "a.de.gz"), str(tmp_path / "a.en")) == (
        ["Hallo Welt.", "Zweite Zeile."], ["Hello world.", "Second line."])
    write(tmp_path / "b.en", "Only one line.\n")
    with pytest.raises(UserError, match="has 2 lines but .*b.en has 1"):
        prepro.read_parallel(str(tmp_path / "a.de.gz"), str(tmp_path / "b.en"))
    write(tmp_path / "latin1.de", "gut\nsch\xf6n\n".encode("latin-1"), "wb")
    with pytest.raises(UserError, match=r"latin1\.de:2: bytes that are not UTF-8"):
        prepro.read_lines(str(tmp_path / "latin1.de"))
    data = gzip.compress(("Satz.\n" * 2000).encode())
    write(tmp_path / "cut.de.gz", data[:len(data) // 2], "wb")
    with pytest.raises(UserError, match=r"cut\.de\.gz:\d+: broken gzip file"):
        prepro.read_lines(str(tmp_path / "cut.de.gz"))


def settings(tmp_path, raw, **kw):
    return hyperparams.Hparams(data_dir=str(raw), prepro_dir=str(tmp_path / "prepro"), vocab_size=100, **kw)


def test_prepro_writes_vocabulary_and_ids(tmp_path, tiny_corpus):
    counts = prepro.prepro(settings(tmp_path, tiny_corpus))
    assert counts == {"train": 30, "dev": 3, "test": 3}
    out = tmp_path / "prepro"
    meta = json.load(open(out / "meta.json"))
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(out / "bpe.model"))
    assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert meta["vocab_size"] == sp.get_piece_size()
    with np.load(out / "dev.npz") as z:
        first = z["tgt_ids"][:z["tgt_lens"][0]]
    assert sp.decode(first.tolist()) == ENGLISH[0]
    assert open(out / "test.de", encoding="utf-8").read().splitlines() == GERMAN[3:]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]  # nothing half-written left


def test_prepro_bad_corpora(tmp_path, tiny_corpus):
    with pytest.raises(UserError, match="missing corpus files dev.de"):
        os.remove(tiny_corpus / "dev.de")
        prepro.prepro(settings(tmp_path, tiny_corpus))
    empty = tmp_path / "empty"
    write_parallel(empty, "train", [], [])
    write_parallel(empty, "dev", ["a"], ["b"])
    write_parallel(empty, "test", ["a"], ["b"])
    with pytest.raises(UserError, match="no sentences in the train split"):
        prepro.prepro(settings(tmp_path, empty))


def test_prepro_command_line(tmp_path, tiny_corpus):
    ok = run_script("prepro.py", "--data_dir", str(tiny_corpus), "--prepro_dir", str(tmp_path / "p"),
                    "--vocab_size", "100")
    assert ok.returncode == 0, ok.stderr
    assert "split train: 30 pairs" in ok.stdout and "split test: 3 pairs" in ok.stdout
    missing = run_script("prepro.py", "--data_dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "missing corpus files train.de[.gz], train.en[.gz]" in missing.stderr


def test_download_checks_checksums(tmp_path, monkeypatch):
    """The download path, served from a local file:// mirror: good files land, a bad one is refused."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    digests = {}
    for name in ("train.de.gz", "train.en.gz"):
        data = gzip.compress(b"Hallo.\n")
        (mirror / name).write_bytes(data)
        digests[name] = __import__("hashlib").sha256(data).hexdigest()
    monkeypatch.setattr(prepro, "MULTI30K_URL", mirror.as_uri() + "/{}")
    monkeypatch.setattr(prepro, "MULTI30K_SHA256", digests)
    hp = hyperparams.Hparams(data_dir=str(tmp_path / "data"))
    prepro.download(hp)
    assert sorted(os.listdir(tmp_path / "data")) == ["train.de.gz", "train.en.gz"]
    (mirror / "train.en.gz").write_bytes(b"tampered")
    os.remove(tmp_path / "data" / "train.en.gz")
    with pytest.raises(UserError, match="sha256 .* is not the expected"):
        prepro.download(hp)
    assert not os.path.exists(tmp_path / "data" / "train.en.gz")  # the damaged file is not left behind


# Messy input: every kind is either cleaned in place or a one-line error; no pair is lost or moved.

def test_messy_lines_are_cleaned_and_stay_in_place(tmp_path):
    de = ["\ufeffErste Zeile.", "  \t ", "Zeile\x00mit\x07Steuer\x1bzeichen.", "Gr\u00fc\u00dfe", "Gru\u0308\u00dfe",
          "ﬁnal　Ｔｅｘｔ", "geteilt\u2028hier\x85dort", "Tab\tund\x0bmehr   Leerraum "]
    en = ["First line.", "Whitespace only on the other side.", "Line with control characters.", "Greetings",
          "Greetings", "final text", "split here there", "tab and more space"]
    write(tmp_path / "m.de", "\r\n".join(de) + "\r\n", "w")
    write(tmp_path / "m.en", "\n".join(en) + "\n", "w")
    src, tgt = prepro.read_parallel(str(tmp_path / "m.de"), str(tmp_path / "m.en"))
    assert src == ["Erste Zeile.", "", "Zeile mit Steuer zeichen.", "Grüße", "Grüße", "final Text",
                   "geteilt hier dort", "Tab und mehr Leerraum"]
    assert src[3] == src[4]  # NFC and NFD spellings become one NFKC form
    assert tgt == en[:6] + ["split here there", "tab and more space"]


def test_prepro_drops_empty_training_pairs_but_keeps_every_test_line(tmp_path, tiny_corpus):
    write_parallel(tiny_corpus, "train", GERMAN * 5 + ["   ", "Nur Deutsch."], ENGLISH * 5 + ["Only English.", "\t"])
    write_parallel(tiny_corpus, "test", ["\ufeffEin Satz.", " ", "Noch\r einer."], ["A sentence.", "", "One more."])
    counts = prepro.prepro(settings(tmp_path, tiny_corpus))
    assert counts["train"] == 30 and counts["test"] == 3
    import data_load
    assert data_load.load_text(str(tmp_path / "prepro"), "test", "de") == ["Ein Satz.", "", "Noch einer."]
    src, tgt = data_load.load_split(str(tmp_path / "prepro"), "test")
    assert [len(s) > 0 for s in src] == [True, False, True]


def test_a_vocabulary_that_does_not_match_the_ids_is_refused(tmp_path, tiny_corpus):
    prepro.prepro(settings(tmp_path, tiny_corpus))
    other = tmp_path / "other"
    prepro.prepro(hyperparams.Hparams(data_dir=str(tiny_corpus), prepro_dir=str(other), vocab_size=60))
    os.replace(other / "bpe.model", tmp_path / "prepro" / "bpe.model")
    import data_load
    with pytest.raises(UserError, match=r"prepro/bpe\.model is not the model that wrote the id files"):
        data_load.load_vocab(str(tmp_path / "prepro"))


# Property-based: the parsers on random input never fail with anything but UserError and never
# lose or reorder a sentence.

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402

PROPERTY = hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# any character that UTF-8 can carry, with the line breaks that are not "\n" (CR, U+2028, NEL, ...)
LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40)


@PROPERTY
@given(st.lists(st.tuples(LINE, LINE), max_size=12), st.booleans(), st.booleans())
def test_parallel_reader_keeps_every_pair_in_order(pairs, crlf, gz):
    import tempfile
    import data_load
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for side in (0, 1):
            raw = ("\r\n" if crlf else "\n").join(p[side] for p in pairs) + ("\n" if pairs else "")
            path = os.path.join(d, f"c{side}" + (".gz" if gz else ""))
            with (gzip.open if gz else open)(path, "wb") as f:
                f.write(raw.encode("utf-8"))
            paths.append(path)
        src, tgt = prepro.read_parallel(*paths)
        assert list(zip(src, tgt)) == [(prepro.clean(s), prepro.clean(t)) for s, t in pairs]
        # what prepro writes for BLEU reads back line for line
        with open(os.path.join(d, "x.de"), "w", encoding="utf-8") as f:
            f.writelines(s + "\n" for s in src)
        assert data_load.load_text(d, "x", "de") == src


@PROPERTY
@given(st.binary(max_size=200))
def test_line_reader_on_random_bytes_reads_or_says_where(data):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for name in ("a.de", "a.de.gz"):
            path = os.path.join(d, name)
            with open(path, "wb") as f:
                f.write(data)
            try:
                lines = prepro.read_lines(path)
            except UserError as e:
                assert re.match(re.escape(path) + r":\d+: ", str(e))
            else:
                if name == "a.de":
                    assert len(lines) == len(data.split(b"\n")) - (data.endswith(b"\n") or not data)


@PROPERTY
@given(st.lists(LINE, min_size=1, max_size=8), st.integers(1, 3))
def test_iwslt_xml_reader_keeps_every_seg_in_order(texts, docs):
    import tempfile
    from xml.sax.saxutils import escape
    # XML 1.0 cannot carry most control characters, even escaped; the release files hold none
    texts = ["".join(c for c in t if c in "\t\r" or (c >= " " and c not in "\ufffe\uffff")) for t in texts]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.xml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(xml([escape(t) for t in texts], docs))
        got = prepro.read_iwslt_xml(path)
    assert [text for _, text, _ in got] == [prepro.clean(t.replace("\r", "\n")) for t in texts] * docs
    assert [key for key, _, _ in got] == [(str(d), str(i + 1)) for d in range(docs) for i in range(len(texts))]


XMLISH = st.lists(st.sampled_from(["<seg id='1'>", "</seg>", "<doc docid='a'>", "</doc>", "<mteval>", "</mteval>",
                                   "&amp;", "&bogus;", "<", ">", "&", "text", " ", "\n", "ä", "<![CDATA[x]]>",
                                   "<!-- c -->", "<?xml version='1.0'?>", "\x00", "\ufeff"]), max_size=30)


@PROPERTY
@given(XMLISH, st.integers(0, 400))
def test_iwslt_xml_reader_on_random_xmlish_input_reads_or_says_where(parts, cut):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.xml")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(parts)[:cut])
        try:
            segs = prepro.read_iwslt_xml(path)
        except UserError as e:
            assert str(e).startswith(path + ":")
        else:
            assert all(isinstance(text, str) for _, text, _ in segs)


@PROPERTY
@given(st.lists(st.one_of(st.tuples(LINE, LINE), st.sampled_from(["<url>u</url>", "<talkid>7</talkid>",
                                                                  "<reviewer href='x'>R</reviewer>"])), max_size=15))
def test_iwslt_train_reader_drops_tag_lines_and_keeps_the_rest_in_order(rows):
    import tempfile
    rows = [r for r in rows if isinstance(r, str) or not any(prepro.TAG_LINE.match(x.lstrip("\ufeff")) for x in r)]
    with tempfile.TemporaryDirectory() as d:
        paths = [os.path.join(d, f"train.tags.de-en.{lang}") for lang in ("de", "en")]
        for side, path in enumerate(paths):
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write("".join((r if isinstance(r, str) else r[side]) + "\n" for r in rows))
        src, tgt = prepro.read_iwslt_train(*paths)
    text = [r for r in rows if not isinstance(r, str)]
    assert list(zip(src, tgt)) == [(prepro.clean(s), prepro.clean(t)) for s, t in text]


def test_prepro_misaligned_seg_ids_are_one_line_naming_both_files_and_lines(tmp_path):
    d = tmp_path / "iwslt"
    os.makedirs(d)
    write(d / "train.tags.de-en.de", TRAIN_DE)
    write(d / "train.tags.de-en.en", TRAIN_EN)
    for tst in ("tst2013", "tst2014"):
        write(d / f"IWSLT16.TED.{tst}.de-en.de.xml", xml(["eins", "zwei", "drei"]))
        write(d / f"IWSLT16.TED.{tst}.de-en.en.xml", xml(["one", "two", "three"]).replace('id="2"', 'id="7"'))
    run = run_script("prepro.py", "--corpus", "iwslt", "--data_dir", str(d), "--prepro_dir", str(tmp_path / "p"),
                     "--vocab_size", "40")
    de, en = (re.escape(str(d / f"IWSLT16.TED.tst2013.de-en.{lang}.xml")) for lang in ("de", "en"))
    assert_one_line_error(run, rf"{de}:6: <seg> \('0', '2'\) faces \('0', '7'\) at {en}:6: the files are not aligned")


def test_your_own_corpus_asks_for_a_vocabulary_size_and_one_too_small_for_its_characters_says_raise_it(tmp_path):
    """Without a preset or --vocab_size, prepro.py on another corpus than the sample asks for a size
    (the sample's 400 pieces are far too few for a real corpus); a text with more distinct characters
    than pieces is told to raise --vocab_size, with the number of characters."""
    raw = tmp_path / "raw"
    kanji = [chr(0x4E00 + i) for i in range(600)]  # 600 distinct characters, 10 a line
    ja = ["".join(kanji[i:i + 10]) + "。" for i in range(0, 600, 10)]
    write_parallel(raw, "train", ja, [f"sentence number {i}." for i in range(len(ja))])
    for split in ("dev", "test"):
        write_parallel(raw, split, ja[:2], ["one.", "two."])
    common = ["--data_dir", str(raw), "--prepro_dir", str(tmp_path / "p"), "--src_lang", "de", "--tgt_lang", "en"]
    assert_one_line_error(run_script("prepro.py", *common), r"raw: your own corpus needs a --vocab_size .*8000")
    assert_one_line_error(run_script("prepro.py", *common, "--vocab_size", "300"),
                          r"the training text has \d{3} distinct characters, more than --vocab_size 300 pieces: "
                          r"raise --vocab_size above \d{3}")
    assert run_script("prepro.py", *common, "--vocab_size", "8000").returncode == 0
