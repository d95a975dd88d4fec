//! `rs_atomic_lat`: perftest's `ib_atomic_lat`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Atomic,
        rsrdma_perftest::Kind::Lat,
    )));
}
