"""The engine: runs an algorithm's rounds on a communicator, knowing no algorithm.

`driver` posts rounds (blocking `run`, nonblocking `Request`), `completion` completes
many requests under a deadline, `staging` hands buffers to MPI (host staging of device
arrays, the scratch pool), `replay` re-posts a recorded schedule (persistent calls).
"""
