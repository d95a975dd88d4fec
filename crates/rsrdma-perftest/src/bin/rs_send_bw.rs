//! `rs_send_bw`: perftest's `ib_send_bw`, on rsrdma.

fn main() {
    std::process::exit(rsrdma_perftest::main(rsrdma_perftest::Tool::new(
        rsrdma_perftest::Verb::Send,
        rsrdma_perftest::Kind::Bw,
    )));
}
