//! perftest-compatible tools (work in progress).
