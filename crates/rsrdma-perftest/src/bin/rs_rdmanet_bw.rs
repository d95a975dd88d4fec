//! `rs_rdmanet_bw`: gordma's `go_rdmanet_bw`, on rsrdma-net's `Conn` (or `RawConn` with `--raw`).

fn main() {
    std::process::exit(rsrdma_perftest::rdmanet::main_bw());
}
