"""The walkthroughs point at code that exists: every `file.py` and `module.name[.attr]` in them
resolves in this project's source (read with ast, nothing imported), in both languages alike."""
import ast
import os
import re
import subprocess

import pytest

from conftest import ROOT

WALKTHROUGHS = ("docs/walkthrough.md", "docs/walkthrough.zh.md")
# the top-level modules and the folders of modules (packages) a document may name
MODULES = {name[:-3] for name in os.listdir(ROOT) if name.endswith(".py")} | {
    name for name in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, name, "__init__.py"))}
CODE = re.compile(r"`([^`\s]+)`")


def names(node):
    """{name: node} of what a module or class body defines: functions, classes, assignments."""
    found = {}
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[child.name] = child
        elif isinstance(child, (ast.Assign, ast.AnnAssign)):
            targets = child.targets if isinstance(child, ast.Assign) else [child.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        found[leaf.id] = child
    return found


def resolves(reference):
    """Whether `file.py` exists, or `module.a.b` names a definition of the project's module."""
    if reference.endswith(".py"):
        return os.path.isfile(os.path.join(ROOT, reference))
    module, *path = reference.split(".")
    while os.path.isfile(os.path.join(ROOT, module, "__init__.py")) and path:  # a package: its module
        module = os.path.join(module, path.pop(0))
    if not os.path.isfile(os.path.join(ROOT, module + ".py")):
        return False
    with open(os.path.join(ROOT, module + ".py"), encoding="utf-8") as f:
        node = ast.parse(f.read())
    for part in path:
        node = names(node).get(part) if hasattr(node, "body") else None
        if node is None:
            return False
    return True


def code_references(path):
    """The backticked spans of a document that name this project's code."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        spans = CODE.findall(f.read())
    return [s for s in spans if re.fullmatch(r"\w+(/\w+)?\.py", s) and s[:-3].split("/")[0] in MODULES
            or re.fullmatch(r"\w+(\.\w+)+", s) and s.split(".")[0] in MODULES and not s.endswith(".py")]


@pytest.mark.parametrize("path", WALKTHROUGHS)
def test_every_code_reference_resolves(path):
    references = code_references(path)
    assert len(references) >= 30, references  # the reading covers the code
    missing = sorted({r for r in references if not resolves(r)})
    assert not missing, f"{path} names code that does not exist: {missing}"


def test_the_two_walkthroughs_name_the_same_code():
    english, chinese = (set(code_references(p)) for p in WALKTHROUGHS)
    assert english == chinese, (english ^ chinese)


def test_the_checker_finds_what_is_not_there():
    assert resolves("modules.MultiHeadAttention.split_heads") and resolves("data_load.PAD")
    assert resolves("trained.lines.translate_lines") and resolves("trained/lines.py")
    assert not resolves("trained.no_such_module.name") and not resolves("trained/no_such_module.py")
    assert not resolves("modules.MultiHeadAttention.no_such_method") and not resolves("modules.no_such_layer")


# Words about how the project was made, not for its users, each with why it came up
MAKERS_WORDS = {
    "../shared": "a folder beside the makers' checkout, which a user does not have: name the file and where to get it",
    "these machines": "the machines the project was built on are not the reader's",
    "been lent": "a GPU lent to the makers' work",
    "nobody asked": "a request the reader never saw",
    "minute target": "a target set for the makers' work",
    "quality target": "the same",
    "both targets": "the same",
    "lever run": "the name of a tuning round",
    "the preset before": "which one: name its commit",
    "rounds ago": "the same",
    "reference's own names": "the reference's checkpoints carried no BLEU: its dev translation files did",
    "laptop cpu": "the CPUs measured are 2-core servers",
    "machine stopped": "the makers' machine, not the reader's",
    "lent machine": "a machine lent to the makers' work",
    "asked for": "a request the reader never saw",
    "the target's": "a target set for the makers' work",
}
# Paths outside the repository: the makers' folders, which a reader does not have; a relative path
# is read from the document's folder
OUTSIDE_PATHS = re.compile(r"(?<![\w.])(?:\.\./)+[\w.-]+|(?<![\w.])/(?:work|tmp/ci|shared)/")


def outside(document, path):
    if not path.startswith(".."):
        return True
    where = os.path.normpath(os.path.join(ROOT, os.path.dirname(document), path))
    return not where.startswith(ROOT + os.sep)
USER_DOCUMENTS = ["README.md", "README.zh.md", "PORTING.md", "CHANGELOG.md",
                  *sorted(os.path.relpath(os.path.join(folder, n), ROOT)
                          for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
                          for n in names if n.endswith(".md"))]


def test_the_documents_speak_to_users():
    found = []
    for document in USER_DOCUMENTS:
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = " ".join(f.read().lower().split())
        found += [f"{document}: '{words}' ({why})" for words, why in MAKERS_WORDS.items() if words in text]
        found += [f"{document}: '{path}' (a path outside the repository)" for path in OUTSIDE_PATHS.findall(text)
                  if outside(document, path)]
    assert not found, "\n".join(found)


def fenced_commands(text):
    """The lines of a document's fenced blocks, their comments left out, one command a line."""
    commands = []
    for block in re.findall(r"^```(?:bash|python|text)\n(.*?)^```", text, re.M | re.S):
        commands += [re.sub(r"\s+#\s.*$", "", line) for line in block.splitlines() if line.strip()]
    return commands


def test_the_chinese_readme_says_what_the_english_one_says():
    """README.zh.md in step with README.md: the same commands (the English lesson's name for the
    Chinese one's), the same figures, tables and links, as many sections and subsections. Its commands
    are not run apart: they are the README's, which tests/docs_commands.py runs."""
    from test_records import tables

    texts = {}
    for name in ("README.md", "README.zh.md"):
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            texts[name] = f.read()
    english, chinese = texts["README.md"], texts["README.zh.md"].replace("lesson.zh.ipynb", "lesson.ipynb")
    assert fenced_commands(chinese) == fenced_commands(english)
    assert tables.figures_of(chinese) == tables.figures_of(english)
    assert [m.group(2) for m in tables.BLOCK.finditer(chinese)] == [m.group(2) for m in tables.BLOCK.finditer(english)]
    for level in ("## ", "### "):
        count = [sum(line.startswith(level) for line in text.splitlines()) for text in (english, chinese)]
        assert count[0] == count[1], f"{level.strip()} sections: README.md {count[0]}, README.zh.md {count[1]}"
    either = {"README.md", "README.zh.md", "lesson.ipynb", "lesson.zh.ipynb", "docs/walkthrough.md",
              "docs/walkthrough.zh.md"}  # each README links both languages' versions its own way
    links = [sorted(set(re.findall(r"\]\(([^)#]+)", text)) - either) for text in (english, chinese)]
    assert links[0] == links[1]


def test_the_readme_is_short_and_in_a_newcomers_order():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: keep it to 300, move the rest to docs/"
    headings = [line[3:] for line in lines if line.startswith("## ")]
    order = ["Quick start", "Learn how it works: the lesson", "Translate, look inside, export", "Recipes", "Results",
             "Speed", "What each choice is worth: ablations", "Tests", "Documents"]
    assert [h for h in headings if h in order] == order, headings


def test_the_citation_file_is_valid_and_the_changelogs_commits_exist():
    import yaml

    with open(os.path.join(ROOT, "CITATION.cff"), encoding="utf-8") as f:
        citation = yaml.safe_load(f)
    assert {"cff-version", "message", "title", "authors"} <= set(citation), sorted(citation)
    assert any("Kyubyong" in str(r.get("repository-code", "")) for r in citation["references"])
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        commits = re.findall(r"^\| \d{4}-\d\d-\d\d \| ([0-9a-f]{7,}) \|", f.read(), re.M)
    assert len(commits) >= 10, commits
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: the commits cannot be looked up")
    # an ancestor of HEAD: a rebased or amended commit's old id stays in the object store (and in a
    # local clone's) for a while, but a clone of the published history does not have it
    missing = [c for c in commits if subprocess.run(["git", "merge-base", "--is-ancestor", c, "HEAD"], cwd=ROOT,
                                                    capture_output=True).returncode != 0]
    assert not missing, f"CHANGELOG.md names commits this history does not have: {missing}"


def test_the_documents_list_every_preset_and_name_readme_sections_that_exist():
    import hyperparams

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    listed = re.search(r"--preset \{([\w,]+)\}", readme).group(1).split(",")
    assert sorted(listed) == sorted(hyperparams.PRESETS), listed
    with open(os.path.join(ROOT, "PORTING.md"), encoding="utf-8") as f:
        porting = f.read()
    assert all(f"`{name}`" in porting for name in hyperparams.PRESETS)
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", readme, re.M)}
    cited = []  # README sections cited by name in the code and the tests: each must begin a heading
    for folder, _, files in os.walk(ROOT):
        if any(part.startswith(".") for part in os.path.relpath(folder, ROOT).split(os.sep)):
            continue
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    cited += re.findall(r"README(?:'s|,) \\?\"([^\"\\]+)\\?\"", f.read())
    assert cited, "no README section is cited: the pattern no longer matches how the code cites them"
    missing = sorted({c for c in cited if not any(h.startswith(c) for h in headings)})
    assert not missing, f"the code cites README sections that do not exist: {missing}"
