//! `rs_read_lat`: perftest's `ib_read_lat`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Read,
        rsrdma_perftest::Kind::Lat,
    )));
}
