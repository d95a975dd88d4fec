//! `rs_write_bw`: perftest's `ib_write_bw`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Write,
        rsrdma_perftest::Kind::Bw,
    )));
}
