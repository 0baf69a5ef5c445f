"""Code the tests share, none of it a test: the MPI library as oracle (`oracle`), the
differential body of mpidp.Comm vs mpi4py (`differential`), DLPack producers
(`dlpackbuf`), communicator stand-ins (`comms`) and the plot checks (`plots`).

The test files import them as ``helpers.<module>``: pytest puts tests/ on ``sys.path``
(it has no ``__init__.py``), in the launched ranks of pytest-isolate-mpi too.
"""
