import gzip
import json
import os

import numpy as np
import pytest

import hyperparams
import prepro
from conftest import ENGLISH, GERMAN, run_script, write_parallel
from utils import UserError

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
