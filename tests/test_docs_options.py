"""Every option the documents name exists: each `--name` in README.md, PORTING.md and docs/*.md
(prose and commands) is a setting (an Hparams field) or an option one of the project's scripts
declares, so a renamed or removed option cannot live on in the docs (read with ast and re, nothing
imported, nothing run)."""
import ast
import glob
import os
import re

from conftest import ROOT

DOCUMENTS = ["README.md", "PORTING.md",
             *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
# Options of other programs that the documents show beside ours, each with where it comes from.
FOREIGN = {
    "--name": "the placeholder of `--name value`",
    "--pad_id": "sentencepiece's trainer, as the reference called it", "--unk_id": "the same",
    "--bos_id": "the same", "--eos_id": "the same",
    "--xla_force_host_platform_device_count": "XLA_FLAGS: JAX's host devices",
    "--xla_cpu_use_onednn": "XLA_FLAGS", "--xla_cpu_experimental_onednn_custom_call": "XLA_FLAGS",
    "--xla_gpu_enable_triton_gemm": "XLA_FLAGS", "--xla_gpu_autotune_level": "XLA_FLAGS",
    "--tf_xla_auto_jit": "TF_XLA_FLAGS", "--tf_xla_cpu_global_jit": "TF_XLA_FLAGS",
    "--tf_xla_ops_to_cluster": "TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory": "TF_XLA_FLAGS",
}
OPTION = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)")


def declared_options():
    """The options of the project: Hparams fields, and every add_argument("--name") of its scripts."""
    options = {"--help", "--preset"}
    for path in glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "bench", "*.py")):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                options |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
            if isinstance(node, ast.ClassDef) and node.name == "Hparams":
                options |= {f"--{s.target.id}" for s in node.body if isinstance(s, ast.AnnAssign)}
    return options


def test_every_option_the_documents_name_exists():
    known = declared_options() | set(FOREIGN)
    unknown = []
    for document in DOCUMENTS:
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                unknown += [f"{document}:{lineno}: --{name}" for name in OPTION.findall(line)
                            if f"--{name}" not in known]
    assert not unknown, "options the scripts do not declare:\n" + "\n".join(unknown)


def test_the_check_knows_the_options_and_finds_a_missing_one():
    known = declared_options()
    assert {"--d_model", "--beam_size", "--average_last", "--format", "--iwslt_synthetic"} <= known
    assert "--no_such_option" not in known and OPTION.findall("use --no_such_option, not x--y") == ["no_such_option"]
