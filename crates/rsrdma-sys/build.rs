//! Compiles the C shim (wrappers for rdma-core's `static inline` verbs, the layout probes and
//! the overhead bench's C baseline) and links libibverbs and librdmacm dynamically.

fn main() {
    println!("cargo:rerun-if-changed=src/inline_wrappers.c");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/bench.c");
    cc::Build::new()
        .file("src/inline_wrappers.c")
        .file("src/shim.c")
        .file("src/bench.c")
        .opt_level(2)
        .warnings(false)
        .compile("rsrdma_shim");
    println!("cargo:rustc-link-lib=ibverbs");
    println!("cargo:rustc-link-lib=rdmacm");
}
