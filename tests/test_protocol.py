"""The model protocol (mpidp/training/protocol.py): the models stay plain, DataParallel slim.

The models offer one protocol and know nothing of the training machinery; what
DataParallel does with a bucket is the reducer's, and each bucket holds one request type.
"""

import ast
import re
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpidp.training import GPT, MLP, DataParallel, softmax_cross_entropy
from mpidp.training.buckets import Reduction
from mpidp.training.gpt import token_cross_entropy
from mpidp.training.protocol import cuts_rows

TRAINING = Path(__file__).resolve().parent.parent / "mpidp" / "training"
MODELS = ("mlp.py", "gpt.py", "layers.py")


def test_no_model_module_imports_or_mentions_the_training_machinery():
    for name in MODELS:
        text = (TRAINING / name).read_text()
        for pattern in (r"ZeRO", r"\bzero\s*=", r"(?i)\bpieces?\b", r"(?i)\bstage\b",
                        r"(?i)\bshard"):
            found = re.findall(pattern, text)
            assert not found, f"{name} mentions {found}"
        imported = {node.module for node in ast.walk(ast.parse(text))
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"ddp", "reducers", "sharded", "pieces", "zero", "zero3",
                               "buckets", "polling"}, (name, imported)


def test_data_parallel_is_short_and_sniffs_no_signature():
    text = (TRAINING / "ddp.py").read_text()
    assert "inspect" not in text
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DataParallel")
    assert cls.end_lineno - cls.lineno + 1 < 200
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    options = [a.arg for a in init.args.args + init.args.kwonlyargs][3:]  # not self, model, comm
    assert len(options) <= 12, options  # about ten, and comm_hook
    for path in TRAINING.glob("*.py"):
        assert len(path.read_text().splitlines()) < 300, path.name


def every_array(value):
    """The arrays inside nested tuples and lists."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from every_array(v)
    elif isinstance(value, np.ndarray):
        yield value


def test_forward_keeps_activations_only_no_parameter():
    """Backward reads the parameters from params: nothing forward keeps is one of them."""
    gpt = GPT(11, 6, n_layer=2, n_head=2, width=8, dtype="float64", seed=0)
    idx = np.random.default_rng(0).integers(0, 11, (2, 6))
    gpt.forward(idx)
    mlp = MLP([5, 4, 3], dtype="float64")
    mlp.forward(np.ones((2, 5)))
    for model in (gpt, mlp):
        kept = {id(a) for a in every_array(model.cache)}
        params = {n for n, p in model.params.items() if id(p) in kept}
        assert not params, f"{type(model).__name__}'s cache holds {params}"


def test_backward_reads_the_parameters_given_at_backward_time():
    """Parameters rebound between forward and backward (what ZeRO-3 does) are the ones used."""
    gpt = GPT(11, 6, n_layer=1, n_head=2, width=8, dtype="float64", seed=0)
    rng = np.random.default_rng(1)
    idx, targets = rng.integers(0, 11, (2, 6)), rng.integers(0, 11, (2, 6))
    _, d = token_cross_entropy(gpt.forward(idx), targets)
    moved = {n: p.copy() for n, p in gpt.params.items()}
    gpt.params.clear()
    gpt.params.update(moved)  # the same values in new arrays
    gpt.backward(d)
    once = {n: g.copy() for n, g in gpt.grads.items()}
    _, d = token_cross_entropy(gpt.forward(idx), targets)
    gpt.backward(d)
    for n in once:
        np.testing.assert_array_equal(once[n], gpt.grads[n], err_msg=n)


class NoRows(MLP):
    """An MLP that does not offer the optional rows part (its backward still takes them)."""

    cuts_rows = False


def test_only_a_model_that_says_it_cuts_rows_is_cut_and_every_bucket_holds_a_reduction():
    assert cuts_rows(MLP([3, 2])) and not cuts_rows(GPT(5, 4, 1, 1, 4))
    assert not cuts_rows(NoRows([3, 2]))
    x, y = np.ones((4, 6)), np.array([0, 1, 2, 0])
    for model, cut in ((MLP([6, 5, 3], dtype="float64"), True),
                       (NoRows([6, 5, 3], dtype="float64"), False)):
        with DataParallel(model, MPI.COMM_SELF, bucket_mb=0, piece_mb=1e-5) as ddp:
            assert (ddp.row_stops is not None) == cut
            ddp.backward(softmax_cross_entropy(ddp.forward(x), y)[1])
            assert {type(b.request) for b in ddp.buckets} == {Reduction}
            assert all(b.request.done for b in ddp.buckets)
