"""One call path: every entry point takes one number of the sequence, and gives it back.

The functions (`mpidp.allreduce` ...), their I-forms, the persistent ``*_init`` forms,
`mpidp.Comm`'s methods and the exact sums of parts all make their plan through
`plan.planned`: a call takes the next number of its communicator's sequence first,
uses it up if its arguments are refused, and gives its slot back when it completes
(a persistent one when it is freed). Checked here on one rank, for every form.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpidp
from mpidp.collectives import state


def forms(comm):
    """name -> (call with good arguments, call with a refused algorithm); each returns what
    the entry point returned (None, a Request or a Persistent)."""
    c = mpidp.Comm(comm)
    x, y, z = np.arange(4.0), np.empty(4), np.empty(4)

    def both(make):
        return make("auto"), make("butterfly")

    return {
        "allreduce": both(lambda a: lambda: mpidp.allreduce(comm, x, y, algorithm=a)),
        "iallreduce": both(lambda a: lambda: mpidp.iallreduce(comm, x, y, algorithm=a)),
        "allreduce_init": both(lambda a: lambda: mpidp.allreduce_init(comm, x, y, algorithm=a)),
        "reduce_scatter": both(lambda a: lambda: mpidp.reduce_scatter(comm, x, y, algorithm=a)),
        "ireduce_scatter": both(lambda a: lambda: mpidp.ireduce_scatter(comm, x, y, algorithm=a)),
        "reduce_scatter_init": both(lambda a: lambda: mpidp.reduce_scatter_init(
            comm, x, y, [4], algorithm=a)),
        "reduce_scatter_block_init": both(lambda a: lambda: mpidp.reduce_scatter_block_init(
            comm, x, y, algorithm=a)),
        "allgather": both(lambda a: lambda: mpidp.allgather(comm, x, y, algorithm=a)),
        "iallgather": both(lambda a: lambda: mpidp.iallgather(comm, x, y, algorithm=a)),
        "allgather_init": both(lambda a: lambda: mpidp.allgather_init(comm, x, y, algorithm=a)),
        "allgatherv_init": both(lambda a: lambda: mpidp.allgatherv_init(
            comm, x, y, [4], algorithm=a)),
        "bcast": both(lambda a: lambda: mpidp.bcast(comm, z, 0, algorithm=a)),
        "ibcast": both(lambda a: lambda: mpidp.ibcast(comm, z, 0, algorithm=a)),
        "bcast_init": both(lambda a: lambda: mpidp.bcast_init(comm, z, 0, algorithm=a)),
        "allreduce_parts": both(lambda a: lambda: mpidp.allreduce_parts(
            comm, [x], y, addends=1, algorithm=a)),
        "iallreduce_parts": both(lambda a: lambda: mpidp.iallreduce_parts(
            comm, [x], y, addends=1, algorithm=a)),
        "ireduce_scatter_parts": both(lambda a: lambda: mpidp.ireduce_scatter_parts(
            comm, [x], y, [4], addends=1, algorithm=a)),
        "allreduce_parts_init": both(lambda a: lambda: mpidp.allreduce_parts_init(
            comm, [x], y, addends=1, algorithm=a, ordered=True)),
        "reduce_scatter_parts_init": both(lambda a: lambda: mpidp.reduce_scatter_parts_init(
            comm, [x], y, [4], addends=1, algorithm=a)),
        "Comm.Allreduce": both(lambda a: lambda: c.Allreduce(x, y, algorithm=a)),
        "Comm.Iallreduce": both(lambda a: lambda: c.Iallreduce(x, y, algorithm=a)),
        "Comm.Allreduce_init": both(lambda a: lambda: c.Allreduce_init(x, y, algorithm=a)),
        "Comm.Reduce_scatter_block": both(lambda a: lambda: c.Reduce_scatter_block(
            x, y, algorithm=a)),
        "Comm.Ireduce_scatter": both(lambda a: lambda: c.Ireduce_scatter(
            x, y, [4], algorithm=a)),
        "Comm.Reduce_scatter_init": both(lambda a: lambda: c.Reduce_scatter_init(
            x, y, [4], algorithm=a)),
        "Comm.Allgather": both(lambda a: lambda: c.Allgather(x, y, algorithm=a)),
        "Comm.Iallgatherv": both(lambda a: lambda: c.Iallgatherv(
            x, [y, [4], [0], MPI.DOUBLE], algorithm=a)),
        "Comm.Allgather_init": both(lambda a: lambda: c.Allgather_init(x, y, algorithm=a)),
        "Comm.Bcast": both(lambda a: lambda: c.Bcast(z, 0, algorithm=a)),
        "Comm.Ibcast": both(lambda a: lambda: c.Ibcast(z, 0, algorithm=a)),
        "Comm.Bcast_init": both(lambda a: lambda: c.Bcast_init(z, 0, algorithm=a)),
    }


NAMES = sorted(forms(MPI.COMM_SELF))


@pytest.mark.parametrize("name", NAMES)
def test_every_entry_point_takes_one_number_and_gives_its_slot_back(name):
    comm = MPI.COMM_SELF.Dup()
    st = state.state(comm)
    good, refused = forms(comm)[name]
    with pytest.raises(ValueError, match="butterfly"):
        refused()
    assert st.started == 1 and not st._busy and not st._held, "a refused call uses its number up"
    out = good()
    assert st.started == 2
    if isinstance(out, mpidp.Persistent):
        for _ in range(2):  # started twice: the sequence does not move
            out.Start()
            out.Wait()
        assert st.started == 2 and st._held, "a persistent call keeps its slot until Free"
        out.Free()
        assert not st._held
    elif out is not None:
        out.wait()
        assert out.done is True
    assert not st._busy, "the slot is back once the collective is complete"
    comm.Free()
