"""The walkthroughs point at code that exists: every `file.py` and `module.name[.attr]` in them
resolves in this project's source (read with ast, nothing imported), in both languages alike."""
import ast
import os
import re

import pytest

from conftest import ROOT

WALKTHROUGHS = ("docs/walkthrough.md", "docs/walkthrough.zh.md")
MODULES = {name[:-3] for name in os.listdir(ROOT) if name.endswith(".py")}
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
    return [s for s in spans if re.fullmatch(r"\w+\.py", s) and s[:-3] in MODULES
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
    assert not resolves("modules.MultiHeadAttention.no_such_method") and not resolves("modules.no_such_layer")
