"""Decoding loops traced as one TensorFlow graph (decoding.one_graph), kept across processes.

Tracing a loop runs its Python once to write its graph: about a second or two for each search, the
largest part of a first translation on a CPU. The traced graph (its functions, as TensorFlow
stores them) is written to a folder, the run's compile_cache/graphs, and a later process that
builds the same loop reads it and calls it on its own model's variables, tracing nothing.

A kept graph is found under a key that holds everything it was traced from: the loop and its
settings, the model's config, kernels and variables, TensorFlow's and Keras' versions, and the
project's code as it is in this process (`code_digest`: every function and class of the modules
the model and the loop are made of, edits made at run time included). A learner's edit to
modules.py, or any of them, is a new key, so it is traced again and never served an old graph.
Delete the folder to start afresh; --compile_cache off keeps nothing.
"""
import functools
import hashlib
import json
import os
import sys
import types

from support.utils import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAIN = (type(None), bool, int, float, complex, str, bytes)


def from_a_library(filename):
    """Whether code from this file is a library's (an installed package or Python's own), whose
    version stands for its code in the key; anything else (the project, a test, a notebook's
    cell) counts by its code."""
    return "site-packages" in filename or filename.startswith(("<frozen", sys.base_prefix + os.sep))


def project_module(module):
    """Whether module is one of the project's own files (not a test's, not a library's, not the
    script's): the modules whose every name counts in the key, whichever process reads them."""
    path = os.path.abspath(getattr(module, "__file__", None) or "/")
    inside = os.path.relpath(path, ROOT).split(os.sep)
    return (path.startswith(ROOT + os.sep) and inside[0] not in (".venv", "tests")
            and module.__name__ != "__main__")


def user_class(cls):
    """Whether cls is written outside a library (the project, a test, a notebook), so its attributes count."""
    module = sys.modules.get(cls.__module__)
    if module is None or module.__name__ in sys.builtin_module_names:
        return False
    return not from_a_library(getattr(module, "__file__", None) or "<notebook>")


def code_digest(*roots):
    """A digest of the code reachable from roots (modules, classes, functions): each function's
    bytecode, constants, defaults and closure, each class's attributes (a library's by name), and
    every name of the project's modules among them and those their names lead to, as they are now
    (edits made at run time included). Line numbers and comments do not count."""
    h, seen, queue, done = hashlib.sha256(), set(), [], set()

    def add(value):  # writes what value is into h; a project module is queued, not walked here
        if isinstance(value, PLAIN):
            h.update(repr(value).encode())
            return
        if id(value) in seen:
            h.update(b"<seen>")
            return
        seen.add(id(value))
        if isinstance(value, types.ModuleType):
            h.update(f"module {value.__name__}".encode())
            if project_module(value):
                queue.append(value)
        elif isinstance(value, types.FunctionType):
            h.update(f"function {value.__module__}.{value.__qualname__}".encode())
            if not from_a_library(value.__code__.co_filename):
                add_code(value.__code__)
                for part in (value.__defaults__, value.__kwdefaults__, value.__dict__.get("__wrapped__")):
                    add(part)
                for cell in value.__closure__ or ():
                    try:
                        add(cell.cell_contents)
                    except ValueError:  # a cell not yet filled
                        h.update(b"<empty>")
                add(sys.modules.get(value.__module__))
        elif isinstance(value, (types.MethodType, staticmethod, classmethod)):
            add(value.__func__)
        elif isinstance(value, property):
            for part in (value.fget, value.fset, value.fdel):
                add(part)
        elif isinstance(value, functools.partial):
            for part in (value.func, value.args, value.keywords):
                add(part)
        elif isinstance(value, type):
            h.update(f"class {value.__module__}.{value.__qualname__}".encode())
            if user_class(value):
                for base in value.__mro__[1:]:
                    add(base)
                for name in sorted(vars(value)):
                    if not name.startswith("__") or name in ("__init__", "__call__"):
                        h.update(name.encode())
                        add(vars(value)[name])
                add(sys.modules.get(value.__module__))
        elif isinstance(value, (tuple, list)):
            h.update(f"{type(value).__name__} {len(value)}".encode())
            for item in value:
                add(item)
        elif isinstance(value, dict):
            h.update(f"dict {len(value)}".encode())
            for name in sorted(value, key=repr):
                add(name)
                add(value[name])
        elif isinstance(value, (set, frozenset)):
            h.update(" ".join(sorted(map(repr, value))).encode())
        else:  # an object (a layer, a tensor, a dtype): its kind; its code is its class's
            add(type(value))

    def add_code(code):
        h.update(code.co_code + " ".join(code.co_names).encode())
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add_code(const)
            else:
                add(const)

    for root in roots:
        add(root)
    while queue:
        module = queue.pop()
        if module.__name__ not in done:
            done.add(module.__name__)
            h.update(f"module {module.__name__}".encode())
            for name in sorted(vars(module)):
                if not name.startswith("__"):
                    h.update(name.encode())
                    add(vars(module)[name])
    return h.hexdigest()


def key(model, loop, settings):
    """The key of model's loop (greedy_loop, beam_loop) traced with settings (a dict: the beam's
    size, alpha, stop): a digest of everything the graph is made of (the module's docstring)."""
    import keras
    import tensorflow as tf

    layers = [model, *model._flatten_layers(include_self=False)]
    methods = (types.FunctionType, types.MethodType)  # set on a layer itself, as an edit may be
    edits = [v for layer in layers for v in vars(layer).values() if isinstance(v, methods)]
    # the model's name and its variables' first part are left out: a second model built in a
    # process is named transformer_1
    variables = [(v.path.partition("/")[2], tuple(v.shape), str(v.dtype)) for v in model.variables]
    made_of = {"loop": loop.__qualname__, "settings": sorted((k, repr(v)) for k, v in settings.items()),
               "config": json.dumps({**model.get_config(), "name": None}, sort_keys=True, default=repr),
               "kernels": sorted(model.kernels.names), "xla_decoding": model.xla_decoding,
               "policy": model.dtype_policy.name, "tensorflow": tf.__version__, "keras": keras.__version__,
               "python": sys.version, "variables": variables,
               "code": code_digest(sys.modules[loop.__module__], type(model), model.parts, *edits)}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:20]


def kept(model, loop, settings, traced):
    """The loop as one graph: read from model.graph_folder (None: none) if a process kept it there
    under its key, else traced now (traced: its tf.function, of source, max_len and min_len) and kept
    there. Either way it is called as `call` says.

    Returns:
      (a function of source, max_len and min_len as traced's, whether it was read from folder).
    """
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework import function_pb2

    folder = model.graph_folder
    path = os.path.join(folder, f"{loop.__name__}-{key(model, loop, settings)}.pb") if folder else None
    if path and os.path.exists(path):
        try:
            with open(path, "rb") as f:
                meta = json.loads(f.readline())
                library = function_pb2.FunctionDefLibrary.FromString(f.read())
            return call(model, meta, library), True
        except (OSError, ValueError, KeyError, StopIteration, DecodeError, tf.errors.OpError):
            pass  # not whole: traced and kept again below
    traced_graph = library_of(model, traced)
    if traced_graph is None:  # the graph holds a value that is not one of the model's variables: not kept
        return traced, False
    meta, library = traced_graph
    if path:
        with atomic_write(path) as tmp, open(tmp, "wb") as f:  # a line of JSON, then the functions
            f.write(json.dumps(meta).encode() + b"\n" + library.SerializeToString())
    return call(model, meta, library), False


def library_of(model, traced):
    """The graph of traced (a tf.function of model's, traced now if not yet) as `call` takes it:
    (meta, its functions as a FunctionDefLibrary), or None where the graph holds a value that is not
    one of model's variables."""
    from tensorflow.core.framework import function_pb2

    concrete = traced.get_concrete_function()
    handles = {id(v.value.handle): i for i, v in enumerate(model.variables)}
    captured = [handles.get(id(tensor)) for tensor in concrete.captured_inputs]
    if None in captured:
        return None
    library = function_pb2.FunctionDefLibrary()
    library.function.extend(concrete.graph.as_graph_def().library.function)
    library.function.append(concrete.function_def)
    return {"variables": captured, "loop": concrete.function_def.signature.name}, library


def call(model, meta, library):
    """A function of (source, max_len, min_len) that calls the graph library (its function
    meta["loop"]) on model's variables (meta["variables"]: their indices in model.variables, in the
    order the graph takes them). Its functions are given names of their own (from a digest of the
    library), so that they never meet a function this process traced under the same name.

    TensorFlow optimizes a graph (Grappler) before its first run: here in one round, not the
    default two, whose second changed a few nodes of a decoding loop at a cost in time; the loops
    run as fast after either (docs/speed.md)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context, execute

    suffix = "_kept_" + hashlib.sha256(library.SerializeToString(deterministic=True)).hexdigest()[:16]
    names = {f.signature.name: f.signature.name + suffix for f in library.function}
    ctx = context.context()
    for function in library.function:
        renamed = rename_calls(function, names)
        if not ctx.has_function(renamed.signature.name):
            ctx.add_function_def(renamed)
    loop = next(f for f in library.function if f.signature.name == meta["loop"])
    outputs = len(loop.signature.output_arg)
    handles = [model.variables[i].value.handle for i in meta["variables"]]
    attrs = ctx.function_call_options.as_attrs()  # as a tf.function calls its graph, but for one setting
    config = config_pb2.ConfigProto.FromString(attrs["config_proto"])
    config.graph_options.rewrite_options.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    attrs = ("executor_type", attrs["executor_type"], "config_proto", config.SerializeToString())

    def run(source, max_len, min_len):
        # the function run as an op of its own, as a tf.function's is: TensorFlow then knows the
        # variables' shapes as it optimizes it (through StatefulPartitionedCall it does not, and a
        # bfloat16 model's graph came out otherwise: a few sentences decoded differently)
        args = [tf.convert_to_tensor(a, tf.int32) for a in (source, max_len, min_len)]
        return tuple(execute.execute(names[loop.signature.name], num_outputs=outputs, inputs=args + handles,
                                     attrs=attrs, ctx=ctx))

    return run


def rename_calls(function, names):
    """A copy of the FunctionDef function under its new name (names: old to new), every function it
    calls (by op or by attribute: a while loop's cond and body, a call's f) renamed as well."""
    from tensorflow.core.framework import function_pb2

    renamed = function_pb2.FunctionDef()
    renamed.CopyFrom(function)
    renamed.signature.name = names[function.signature.name]
    for node in renamed.node_def:
        if node.op in names:
            node.op = names[node.op]
        for attr in node.attr.values():
            if attr.HasField("func") and attr.func.name in names:
                attr.func.name = names[attr.func.name]
            for func in attr.list.func:
                if func.name in names:
                    func.name = names[func.name]
    return renamed
