"""The project's page-building tools, outside the `mpidp` package: they turn the
benchmarks' JSON into docs pages and judge the targets (`make bench`, `make
bench-publish`, `make overlap-hosts-doc` run them as ``python -m tools.report`` ...)."""
