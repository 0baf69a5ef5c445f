# the probe behind async-probe.txt: python -m mpidp.cluster run --hosts 2 --rate 1gbit -- env MPIR_CVAR_ASYNC_PROGRESS=0|1 python docs/bench/overlap-hosts/async-probe.py
import time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.Get_rank()
buf = np.ones(4 << 20, np.uint8)  # 4 MiB: rendezvous
c.Barrier()
if r == 0:
    req = c.Irecv(buf, 1, 0)
    time.sleep(1.0)  # no MPI call: only an asynchronous progress engine can move it
    t = MPI.Wtime(); req.Wait()
    print("receiver's Wait after 1 s asleep took", round(1e3 * (MPI.Wtime() - t), 1), "ms", flush=True)
else:
    time.sleep(0.05)
    t = MPI.Wtime(); c.Send(buf, 0, 0)
    print("sender's Send took", round(1e3 * (MPI.Wtime() - t), 1), "ms", flush=True)
