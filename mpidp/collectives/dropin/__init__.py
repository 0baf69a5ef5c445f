"""The mpi4py drop-in: `mpidp.Comm`, its argument parsing and buffer specs, DLPack
interop, and `CountingComm` (a comm that counts the bytes it carries)."""
