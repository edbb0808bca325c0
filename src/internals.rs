//! Hidden entry points for the micro-benchmarks (feature `bench-internals`). Not API.
