//! `rs_send_lat`: perftest's `ib_send_lat`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Send,
        rsrdma_perftest::Kind::Lat,
    )));
}
