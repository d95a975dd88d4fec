//! `rs_rdmanet_lat`: gordma's `go_rdmanet_lat`, ping-pong on rsrdma-net's `Conn`.

fn main() {
    std::process::exit(rsrdma_perftest::rdmanet::main_lat());
}
