"""What a model offers `DataParallel`: the one protocol the MLP and the GPT meet.

    params, grads    dicts name -> array; backward writes each gradient into its
                     array (``out=``, ``+=``), never rebinds it (they may be views
                     of the buckets' buffers, `buckets.py`)
    xp               the array module of both (NumPy, CuPy)
    layers           U, the number of units (an MLP layer; a GPT block, its
                     embedding, its head), numbered 1 .. U in forward's order
    names(i)         the parameters whose gradients unit i writes or adds to
    forward(x, on_layer=None)
                     calls on_layer(i) after unit i, i = 1 .. U
    backward(d, on_grad=None, accumulate=False)
                     calls on_grad(i) once unit i's gradients are written, i = U .. 1
                     (backward completes them in order); accumulate: add to grads.
                     It reads every parameter from ``params`` when it needs it: what
                     forward keeps for backward holds activations, no parameter

Optional, backward by rows: a model whose ``cuts_rows`` is True names, for each
unit, a weight W (in, out) and a bias b (out,), ``names(i) == (W, b)``, and its
backward also takes

    row_stops        unit i -> increasing row stops of W_i, the last one ``in``:
                     unit i writes db_i, then dW_i's rows [0, s0), [s0, s1), ...
                     (a unit not in it runs whole)
    on_rows          on_rows(i, stop) after each slice: rows [0, stop) of dW_i and
                     db_i are final; on_rows(i, None) between the later slices of
                     unit i's work (points where communication may progress)

Each slice is then a contiguous part of the unit's gradients in a bucket (W's rows,
then b), which a reduction may start on at once (`pieces.py`).

Optional, micro-batches apart: a model whose ``micro_batches_apart`` is True takes

    micro_batches    (forward) K: the batch is K micro-batches of B/K samples side
                     by side, each computed as a batch of its own would be
    part_grads       (backward) K - 1 dicts like ``grads``: the first K - 1
                     micro-batches' gradients go to these, the last one's to
                     ``grads``, each bitwise what a backward of it alone writes
                     (deterministic mode's micro-shards, `determinism.SideBySide`);
                     where they are rows of one array, ``part_grads.stacked`` is
                     name -> that (K - 1, *shape) view, which a backward may write
                     with one batched product (the MLP's; `determinism.PartGrads`)
"""

from __future__ import annotations


def cuts_rows(model) -> bool:
    """Whether `model`'s backward takes ``row_stops`` and ``on_rows`` (the optional part)."""
    return getattr(model, "cuts_rows", False) is True


def micro_batches_apart(model) -> bool:
    """Whether `model`'s forward takes ``micro_batches`` and its backward ``part_grads``
    (the other optional part)."""
    return getattr(model, "micro_batches_apart", False) is True
