"""The documents' commands, read and run as a user would type them (tests/test_docs_commands.py).

Every fenced ```bash and ```python block of README.md, PORTING.md and docs/*.md is a list of
commands. Each page runs in its own scratch checkout (a temporary folder with the project's
scripts, bench/ and corpora/ linked in, so relative paths such as prepro/multi30k, log/en-fr and
exported/ land there as they would in a clone), its blocks in order; the README first, and a page
of docs/ starts with what the README's commands made (STARTS_FROM). A command fails on a non-zero
exit status (an option a script does not accept is one) or a traceback.

What changes before a command runs (SUBSTITUTIONS, each written down where it is applied):
- `.venv/bin/python` and `python` are this interpreter (the suite runs in that environment);
- the user's files are the sample corpus (corpora/sample) under the names a recipe expects:
  data/multi30k in Multi30k's file names, data/iwslt2016 in the IWSLT release's format,
  my_corpus as en/fr (the sample's German stands in for French);
  my_ja_en is a Japanese-English corpus written here with thousands of distinct characters;
- `--download` is dropped: data/<preset> already holds the files (the tests do not use the network);
- every train.py but the quick start's trains one epoch of a tiny model
  (`--num_epochs 1 --d_model 32 --d_ff 64 --num_blocks 1 --num_heads 2`), ablate.py one seed of
  such runs, and a benchmark measures two steps of that model in batches of 512 tokens; the quick
  start runs exactly as typed (the other tests use its model);
- a command that the pages repeat word for word runs once (Checkout.run_command);
- the environment adds `TF_CPP_MIN_LOG_LEVEL=2` (TensorFlow's C++ log below errors, as every
  script sets when it starts) and `XLA_FLAGS=--xla_backend_optimization_level=0`
  (conftest.XLA_FLAGS, as for every process of the tests): on the tiny models, compiling
  TensorFlow's decoding loops and every step on JAX is most of that time.

What is not run, and why, one command at a time: SKIPPED (by the command's first words), blocks
under an "Archive" heading or on the pages of dated entries (ARCHIVES: the code of their own commit),
blocks tagged as text rather than bash or python (a listing), and the commands written inline in
the prose (`python ...` in backticks): those that equal a fenced command run with it, the others
are listed in INLINE_NOT_RUN with the reason. `python tests/docs_commands.py` prints every command
of the documents with what happens to it.
"""
import fnmatch
import os
import re
import shlex
import subprocess
import sys

from conftest import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md", "PORTING.md", *sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                                                 if n.endswith(".md")),
             *sorted(os.path.join("docs", "archive", n) for n in os.listdir(os.path.join(ROOT, "docs", "archive"))
                     if n.endswith(".md"))]
# Pages of dated entries, each run with the code of its own commit: none of their commands runs here
ARCHIVES = ("docs/archive/*", "docs/reference_study.md")
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "console": "shell", "python": "python"}
TEXT_TAGS = {"text": "a listing (files, output), not commands"}
TINY_MODEL = ["--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2"]
ADDED = {  # script: what is appended to its command line (beside the quick start)
    "train.py": ["--num_epochs", "1", *TINY_MODEL],
    "bench/train_speed.py": ["--steps", "2", "--yardsticks", "none", "--reference_shaped", "0", *TINY_MODEL,
                             "--tokens_per_batch", "512"],
    "ablate.py": ["--seeds", "1", "--num_epochs", "1", *TINY_MODEL],  # one seed; the rest reaches train.py
}
SKIPPED = {  # a command's first words: why it is not run here
    "bash demo.sh": "installs the environment from nothing; its three commands are the quick start's "
                    "(checked equal to README's quick-start block)",
    "bash setup.sh": "installs the environment: .ci/run does it from nothing before the tests",
    "bash test.sh": "the test suite itself (.ci/run runs exactly these commands: checked)",
    "export TF_CONFIG=": "training across two machines needs the two machines",
    ".venv/bin/python train.py --preset iwslt2016 --logdir /mnt/shared/": "the second machine's half of the command "
                                                                      "before it (TF_CONFIG)",
    ".venv/bin/pip install jupyterlab": "installs from the network (the tests run the lesson without Jupyter's "
                                        "server: tests/test_lesson.py)",
    ".venv/bin/pip install \"tensorflow[and-cuda]": "installs a GPU build from the network, for a machine with a GPU",
    ".venv/bin/pip install \"jax[cuda13]": "installs a GPU build from the network, for a machine with a GPU",
    ".venv/bin/python -m jupyter lab": "opens a browser; tests/test_lesson.py runs every cell of the lesson",
    "git clone URL": "fetches the repository from the network: the tests run in a checkout of it already",
    "python bench/tables.py": "writes the repository's own docs/records/ and documents: tests/test_records.py "
                              "runs the same code on them (--check) and on records of its own",
    ".venv/bin/python page.py": "serves until stopped: tests/test_page.py starts it on the quick start's model, "
                                "sends it requests and drives it in a headless browser",
}
# Commands written inline in the prose that are not run, by document (a glob) and the command's
# pattern: why. A command a reader would type is better shown in a fenced block, where it runs.
FIGURE = ("the command of a recorded figure, at full size (minutes to hours); the fenced blocks run its scripts "
          "at test size, and tests/test_docs_options.py checks its options exist")
INLINE_NOT_RUN = [
    *((archive, r".*", "an archived entry's command: it ran with the code of its own commit, which the entry names")
      for archive in ARCHIVES),
    ("docs/results.md", r".*", FIGURE),
    ("docs/speed.md", r".*", FIGURE),
    ("docs/ablations.md", r"python ablate.py --preset multi30k( --report)?( --output docs/ablations.md)?"
     r"( --ledger docs/ablations.json)?( --precision float32)?$",
     "trains or reports the whole table (hours); README's fenced ablate.py command runs one row"),
    ("docs/ablations.md", r"python bench/train_speed\.py --preset multi30k", FIGURE),
    ("docs/recipes.md",
     r"python ablate\.py --table recipes( --only \S+)?( --report)? --output docs/recipes\.md( --record \S+)?$",
     "trains or reports the whole recipe search (hours, alone on the machine); tests/test_ablate.py runs --table "
     "recipes on made-up figures and README's fenced ablate.py command runs one row of the ablations"),
    ("docs/ablations-current.md", r"python ablate\.py --table current --only [\w,]+ --ledger "
     r"docs/ablations-current\.json --output docs/ablations-current\.md( --report)?$",
     "trains or reports rows against the preset as it is (hours); tests/test_ablate.py runs --table current on "
     "made-up figures and README's fenced ablate.py command runs one row of the ablations"),
    ("docs/ablations.md", r"python reference.py curves --prepro_dir prepro/multi30k",
     "four trainings at the multi30k_reference size (hours); tests/test_reference.py runs the same command at test "
     "size (one epoch of a tiny model a run)"),
    ("docs/ablations.md", r"python reference.py curves --draw --workdir docs/reference_curves$",
     "draws the records in docs/reference_curves in place; tests/test_reference.py runs it on a copy of that folder "
     "and checks it makes the curves.md there"),
    ("*", r"bash demo\.sh$", SKIPPED["bash demo.sh"]),
    ("*", r"bash setup\.sh", SKIPPED["bash setup.sh"]),
    ("docs/using.md", r"\.venv/bin/tensorboard --logdir",
     "a server that runs until it is stopped; tests/test_train.py reads the event files it would show"),
    ("README.md", r"\.venv/bin/python tests/docs_commands\.py$",
     "prints this list; tests/test_docs_commands.py checks the same list accounts for every command"),
    ("*", r"\w+\.py --\w+$", "an option of a script named in a sentence, not a command line"),
]
QUICK_START = ("README.md", "Quick start")  # the block the other tests take their trained model from


class Block:
    def __init__(self, document, line, heading, language, text, tag=""):
        self.document, self.line, self.heading, self.language, self.text = document, line, heading, language, text
        self.tag = tag  # the fence's language tag as written ("" for none)
        self.id = f"{document}:{line}"

    def commands(self):
        """The block's commands: shell lines with their continuations joined, or the Python code whole."""
        if self.language == "python":
            return [self.text]
        if self.language is None:
            return []
        joined = re.sub(r"\\\n\s*", " ", self.text)
        return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]

    def skipped(self):
        """Why none of the block's commands runs, or None."""
        if self.language is None and not self.tag:
            return "no language tag: not run (tag it bash to run it, text to show a listing)"
        if self.language is None:
            return TEXT_TAGS.get(self.tag, f"tagged {self.tag!r}, not bash or python")
        reasons = [self.command_skipped(c) for c in self.commands()]
        return "; ".join(dict.fromkeys(reasons)) if reasons and all(reasons) else None

    def command_skipped(self, command):
        """Why this one command of the block is not run, or None."""
        if "Archive" in self.heading or any(fnmatch.fnmatch(self.document, a) for a in ARCHIVES):
            return "an archived entry (under an Archive heading, or on a page of them): the code of its own commit"
        if self.language == "shell":
            for start, why in SKIPPED.items():
                if command.startswith(start):
                    return why
        return None


def blocks():
    """Every fenced block of the documents, in the order they run, with its headings (those tagged
    other than bash or python too: they are reported, never run)."""
    found = []
    for document in DOCUMENTS:
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            lines = f.read().splitlines()
        headings, fence = {}, None  # level: title; the open block's (line, tag, lines)
        for number, line in enumerate(lines, 1):
            if fence is None and line.startswith("```"):
                fence = (number, line[3:].strip().split(" ")[0], [])
            elif fence is not None and line.startswith("```"):
                heading = " / ".join(headings[k] for k in sorted(headings))
                found.append(Block(document, fence[0], heading, LANGUAGES.get(fence[1]), "\n".join(fence[2]) + "\n",
                                   fence[1]))
                fence = None
            elif fence is not None:
                fence[2].append(line)
            elif re.match(r"#+ ", line):
                level = len(line) - len(line.lstrip("#"))
                headings = {k: v for k, v in headings.items() if k < level}
                headings[level] = line[level:].strip()
    return found


# A command written inline: a backticked span that starts with a program a user runs, or with one of
# the project's scripts and an option
INLINE = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(?:python3?|bash|tensorboard|pip|ruff|jupyter)\s"
                    r"|^(?:bench/)?\w+\.py\s+--")


def inline_commands():
    """[(document, line, command)]: the commands written inline in the documents' prose (outside
    fenced blocks; a span may wrap onto the next line)."""
    found = []
    for document in DOCUMENTS:
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            lines = f.read().splitlines()
        fence, prose = False, []
        for line in lines:
            if line.startswith("```"):
                fence = not fence
            prose.append("" if fence or line.startswith("```") else line)
        text = "\n".join(prose)
        for match in re.finditer(r"`([^`]+)`", text):
            command = " ".join(match.group(1).split())
            if INLINE.search(command):
                found.append((document, text.count("\n", 0, match.start()) + 1, command))
    return found


def inline_verdict(document, command, fenced=None):
    """(True, where) if the inline command runs (it equals a fenced command that runs), else (False, why)."""
    fenced = fenced if fenced is not None else fenced_commands()
    normal = " ".join(command.split())
    if normal in fenced:
        return True, f"runs as the fenced command at {fenced[normal]}"
    for pattern, regex, why in INLINE_NOT_RUN:
        if fnmatch.fnmatch(document, pattern) and re.match(regex, normal):
            return False, why
    return False, None


def fenced_commands():
    """{command, whitespace normalised: the block id where it runs} of the fenced commands that run."""
    found = {}
    for block in blocks():
        for command in block.commands():
            if block.language == "shell" and not block.command_skipped(command):
                found.setdefault(" ".join(command.split()), block.id)
    return found


def report():
    """Every command of the documents, one line each: where, run or not run (and why)."""
    lines = []
    for block in blocks():
        if block.language is None or not block.commands():
            why = block.skipped() or "no commands"
            lines.append(f"{block.id}  not run  ({why})  [block tagged {block.tag or 'nothing'}]")
        for command in block.commands():
            why = block.command_skipped(command)
            shown = command if block.language == "shell" else "(the Python block)"
            lines.append(f"{block.id}  {'not run  (' + why + ')' if why else 'run'}  {shown}")
    fenced = fenced_commands()
    for document, line, command in inline_commands():
        runs, why = inline_verdict(document, command, fenced)
        lines.append(f"{document}:{line}  {'run' if runs else 'not run'}  ({why or 'NOT ACCOUNTED FOR'})  "
                     f"`{command}`")
    return lines


def quick_start_block():
    return next(b for b in blocks() if b.document == QUICK_START[0] and QUICK_START[1] in b.heading
                and "prepro.py" in b.text)


def substitute(command):
    """A shell command line as it runs here (the SUBSTITUTIONS above), quoted for bash -c."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|;&")
    lexer.whitespace_split, lexer.commenters = True, "#"
    words, out, segment_start = list(lexer), [], True
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("|", "||", "&&", ";"):
            out.append(word)
            segment_start = True
        elif segment_start and re.fullmatch(r"[A-Z_]+=.*", word):
            out.append(shlex.quote(word))
        elif segment_start and word in (".venv/bin/python", "python"):
            script = words[i + 1] if i + 1 < len(words) else ""
            end = next((j for j in range(i + 1, len(words)) if words[j] in ("|", "||", "&&", ";")), len(words))
            args = [w for w in words[i + 1:end] if w != "--download"]
            quick = script == "train.py" and args[1:] == ["--preset", "sample"]
            args += [] if quick else ADDED.get(script, [])
            out += [shlex.quote(sys.executable), *map(shlex.quote, args)]
            i = end
            segment_start = False
            continue
        else:
            out.append(shlex.quote(word))
            segment_start = False
        i += 1
    return " ".join(out)


class Checkout:
    """A scratch checkout in `path` for one document: the project linked in, the user's files
    written, and what the pages it follows made (`start`: folders copied from another checkout).
    Runs the document's blocks in order, each once, and keeps what each command did."""

    def __init__(self, path, document, start=(), ran=None):
        import shutil
        self.path, self.document = str(path), document
        self.ran = {} if ran is None else ran  # command as run: its result, shared by the checkouts
        for name in os.listdir(ROOT):
            package = os.path.isfile(os.path.join(ROOT, name, "__init__.py"))  # a folder of the code
            if name.endswith(".py") or package or name in ("bench", "corpora", "demo.sh", "setup.sh"):
                os.symlink(os.path.join(ROOT, name), os.path.join(self.path, name))
        write_user_files(self.path)
        for source, folder in start:
            shutil.copytree(os.path.join(source, folder), os.path.join(self.path, folder))
        self.done = {}  # block id: [(command as run, CompletedProcess)]

    def run(self, block):
        """Run every block of the document up to `block` that has not run; `block`'s [(command, result)]."""
        for earlier in blocks():
            if earlier.document != self.document:
                continue
            if earlier.id not in self.done and not earlier.skipped():
                self.done[earlier.id] = [self.run_command(earlier, c) for c in earlier.commands()
                                         if not earlier.command_skipped(c)]
            if earlier.id == block.id:
                break
        return self.done[block.id]

    def ran_elsewhere(self, block, done):
        """`block` ran in another checkout of the same document, whose folders this one started
        from: done is its [(command as run, result)]."""
        self.done[block.id] = done
        self.ran.update(done)

    def run_all(self):
        for block in blocks():
            if block.document == self.document and not block.skipped():
                self.run(block)
        return self

    def run_command(self, block, command):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")  # XLA_FLAGS: conftest's
        if block.language == "python":
            argv, shown = [sys.executable, "-c", command], f"the Python block at {block.id}"
        else:
            shown = substitute(command)
            argv = ["bash", "-c", "set -o pipefail; " + shown]
            if shown in self.ran:  # repeated word for word by a later page, which starts from its results
                return shown, self.ran[shown]
        words = shlex.split(shown) if block.language != "python" else []
        if (words[:1] == [sys.executable] and words[1].endswith(".py") and os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "2"
                and not {"|", "||", "&&", ";", "&"} & set(words)):
            result = run_script(*words[1:], cwd=self.path, timeout=900)  # one script alone: no shell needed
        else:
            result = subprocess.run(argv, cwd=self.path, capture_output=True, text=True, env=env, timeout=900)
        self.ran[shown] = result
        return shown, result


# Each page runs in its own checkout, as a reader following it would. The README comes first; a
# page of docs/ starts with what README's commands made (prepro/, log/, exported/), and a command it
# repeats word for word is not run again (its result is the README's). docs/devices.md starts with
# the prepared data only: it trains the IWSLT presets with other batches than README's runs of them,
# which those runs would refuse (a run keeps its batches).
STARTS_FROM = {"docs/devices.md": ["prepro"]}


def start_of(document):
    return [] if document == "README.md" else STARTS_FROM.get(document, ["prepro", "log", "exported"])


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def sample(split, lang):
    with open(os.path.join(ROOT, "corpora", "sample", f"{split}.{lang}"), encoding="utf-8") as f:
        return f.read().splitlines()


def iwslt_xml(lines):
    segs = "".join(f'<seg id="{i + 1}"> {line} </seg>\n' for i, line in enumerate(lines))
    return ['<mteval>', '<srcset setid="x" srclang="german">', '<doc docid="1" genre="lectures">',
            "<title>t</title>", segs.rstrip("\n"), "</doc>", "</srcset>", "</mteval>"]


def japanese(n, seed=0):
    """n Japanese-looking sentences over about 3,000 distinct kanji (more characters than the sample
    vocabulary's pieces, as a real Japanese corpus has), with kana particles between them."""
    import random
    rng = random.Random(seed)
    kanji = [chr(0x4E00 + i) for i in range(0, 3000 * 6, 6)]
    particles = ["が", "を", "に", "で", "は", "の", "と"]
    return ["".join(rng.choice(kanji) + rng.choice(kanji) + rng.choice(particles) for _ in range(rng.randint(3, 8)))
            + "。" for _ in range(n)]


def write_user_files(root):
    """The files the recipes expect a user to have, made from the sample corpus (see SUBSTITUTIONS)."""
    join = os.path.join
    names = {"train": "train", "dev": "val", "test": "test_2016_flickr"}
    for split, name in names.items():
        for lang in ("de", "en"):
            write_lines(join(root, "data", "multi30k", f"{name}.{lang}"), sample(split, lang))
        write_lines(join(root, "my_corpus", f"{split}.en"), sample(split, "en"))
        write_lines(join(root, "my_corpus", f"{split}.fr"), sample(split, "de"))
    for lang in ("de", "en"):
        tags = ["<url>http://www.ted.com/talks/a.html</url>", "<talkid>1</talkid>"]
        write_lines(join(root, "data", "iwslt2016", f"train.tags.de-en.{lang}"), tags + sample("train", lang))
        for tst, split in (("tst2013", "dev"), ("tst2014", "test")):
            write_lines(join(root, "data", "iwslt2016", f"IWSLT16.TED.{tst}.de-en.{lang}.xml"),
                        iwslt_xml(sample(split, lang)))
    counts = {"train": 600, "dev": 30, "test": 30}
    for split, n in counts.items():
        write_lines(join(root, "my_ja_en", f"{split}.ja"), japanese(n, seed=len(split)))
        english = sample("train", "en") * 2
        write_lines(join(root, "my_ja_en", f"{split}.en"), english[:n])


if __name__ == "__main__":
    print("\n".join(report()))
