"""Benchmarks: ``python -m mpidp.bench {collectives,overlap,calibrate} ...`` under mpiexec."""
