//! `rs_read_bw`: perftest's `ib_read_bw`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Read,
        rsrdma_perftest::Kind::Bw,
    )));
}
