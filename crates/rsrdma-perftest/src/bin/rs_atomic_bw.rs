//! `rs_atomic_bw`: perftest's `ib_atomic_bw`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Atomic,
        rsrdma_perftest::Kind::Bw,
    )));
}
