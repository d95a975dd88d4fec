//! `cargo xtask regen-bindings`: runs bindgen over rdma-core's headers and writes the committed
//! bindings (types and constants) and the table of functions rsrdma-sys loads at run time. Needs
//! libclang (`libclang-dev`) and rdma-core's headers; a normal build needs neither, because the
//! output is committed.

use anyhow::{Context, Result};
use std::path::Path;

/// Enums whose values the provider or the kernel writes: a Rust `enum` would be undefined
/// behaviour on an unknown value, so these become newtypes over the integer.
#[cfg(feature = "regen")]
const NEWTYPE_ENUMS: &[&str] = &[
    "ibv_wc_status",
    "ibv_wc_opcode",
    "ibv_qp_state",
    "ibv_port_state",
    "ibv_mtu",
    "ibv_qp_type",
    "ibv_wr_opcode",
    "ibv_event_type",
    "ibv_node_type",
    "ibv_transport_type",
    "ibv_atomic_cap",
    "ibv_gid_type",
    "ibv_mig_state",
    "rdma_cm_event_type",
    "rdma_port_space",
    "ibv_srq_type",
];

/// Flag enums: bit sets that callers combine.
#[cfg(feature = "regen")]
const BITFIELD_ENUMS: &[&str] = &[
    "ibv_access_flags",
    "ibv_send_flags",
    "ibv_wc_flags",
    "ibv_qp_attr_mask",
    "ibv_srq_attr_mask",
    "ibv_device_cap_flags",
    "ibv_port_cap_flags",
    "ibv_create_cq_wc_flags",
    "ibv_qp_create_send_ops_flags",
    "ibv_qp_init_attr_mask",
];

/// Without the `regen` feature, rebuilds xtask with it (bindgen is heavy, and only this
/// command needs it) and runs the command again.
#[cfg(not(feature = "regen"))]
pub fn run(root: &Path) -> Result<()> {
    let status = std::process::Command::new(crate::vm::cargo())
        .args([
            "run",
            "--quiet",
            "-p",
            "xtask",
            "--features",
            "regen",
            "--",
            "regen-bindings",
        ])
        .current_dir(root)
        .status()
        .context("running cargo")?;
    anyhow::ensure!(status.success(), "regen-bindings failed");
    Ok(())
}

/// The exported functions of libibverbs and librdmacm that rsrdma-sys loads at run time
/// (`dynamic.rs`): what rsrdma calls, and what the `static inline` verbs it ports to Rust
/// (`inline.rs`) call. rdma-core is not linked: a machine without it still builds and runs
/// everything but the RDMA devices (see rsrdma-sys's docs).
#[cfg(feature = "regen")]
const DYNAMIC_FUNCTIONS: &[&str] = &[
    // libibverbs: devices and contexts
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_get_device_guid",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_fork_init",
    "ibv_get_async_event",
    "ibv_ack_async_event",
    "ibv_query_device",
    "ibv_query_port",
    "ibv_query_gid",
    "_ibv_query_gid_ex",
    "_ibv_query_gid_table",
    "ibv_query_pkey",
    // objects
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_reg_mr_iova2",
    "ibv_reg_dmabuf_mr",
    "ibv_dereg_mr",
    "ibv_create_comp_channel",
    "ibv_destroy_comp_channel",
    "ibv_create_cq",
    "ibv_resize_cq",
    "ibv_destroy_cq",
    "ibv_get_cq_event",
    "ibv_ack_cq_events",
    "ibv_create_srq",
    "ibv_modify_srq",
    "ibv_query_srq",
    "ibv_destroy_srq",
    "ibv_create_qp",
    "ibv_qp_to_qp_ex",
    "ibv_modify_qp",
    "ibv_query_qp",
    "ibv_destroy_qp",
    "ibv_create_ah",
    "ibv_init_ah_from_wc",
    "ibv_create_ah_from_wc",
    "ibv_destroy_ah",
    // strings
    "ibv_wc_status_str",
    "ibv_event_type_str",
    "ibv_port_state_str",
    "ibv_node_type_str",
    // librdmacm
    "rdma_create_event_channel",
    "rdma_destroy_event_channel",
    "rdma_create_id",
    "rdma_destroy_id",
    "rdma_migrate_id",
    "rdma_bind_addr",
    "rdma_resolve_addr",
    "rdma_resolve_route",
    "rdma_create_qp",
    "rdma_destroy_qp",
    "rdma_connect",
    "rdma_listen",
    "rdma_accept",
    "rdma_init_qp_attr",
    "rdma_establish",
    "rdma_reject",
    "rdma_disconnect",
    "rdma_get_cm_event",
    "rdma_ack_cm_event",
    "rdma_event_str",
    "rdma_get_devices",
    "rdma_free_devices",
];

#[cfg(feature = "regen")]
fn builder(sys: &Path) -> bindgen::Builder {
    bindgen::Builder::default()
        .header(sys.join("wrapper.h").to_string_lossy())
        .size_t_is_usize(true)
        .prepend_enum_name(false)
}

#[cfg(feature = "regen")]
pub fn run(root: &Path) -> Result<()> {
    use bindgen::CodegenConfig;
    let sys = root.join("crates/rsrdma-sys");
    // Types and constants only: no function is linked (see DYNAMIC_FUNCTIONS).
    let mut types = builder(&sys)
        .with_codegen_config(CodegenConfig::TYPES | CodegenConfig::VARS)
        .allowlist_type("_*ibv_.*|verbs_.*|rdma_.*|pthread_mutex_t|pthread_cond_t")
        .allowlist_var("IBV_.*|RDMA_.*")
        .opaque_type("pthread_.*")
        .no_debug("pthread_.*")
        .derive_default(true)
        .derive_debug(true)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(true);
    for e in NEWTYPE_ENUMS {
        types = types.newtype_enum(e);
    }
    for e in BITFIELD_ENUMS {
        types = types.bitfield_enum(e);
    }
    let out = sys.join("src/bindings.rs");
    types
        .generate()
        .context("bindgen failed (is libclang-dev installed?)")?
        .write_to_file(&out)
        .context("writing bindings.rs")?;

    // The functions' declarations, exactly as the headers give them, turned into the table
    // that `dynamic.rs` loads with dlsym.
    let mut fns = builder(&sys)
        .with_codegen_config(CodegenConfig::FUNCTIONS)
        .allowlist_recursively(false);
    for f in DYNAMIC_FUNCTIONS {
        fns = fns.allowlist_function(format!("^{f}$"));
    }
    let decls = fns
        .generate()
        .context("bindgen failed on the functions")?
        .to_string();
    let table = dynamic_table(&decls)?;
    let out_fns = sys.join("src/dynamic_fns.rs");
    std::fs::write(&out_fns, table).context("writing dynamic_fns.rs")?;
    println!("wrote {} and {}", out.display(), out_fns.display());
    Ok(())
}

/// Turns bindgen's `extern "C" { pub fn name(args) -> ret; }` blocks into one
/// `dynamic_functions!` invocation, each function tagged with its library.
#[cfg(feature = "regen")]
fn dynamic_table(decls: &str) -> Result<String> {
    let mut out = String::from(
        "// Generated by `cargo xtask regen-bindings`: do not edit.\n\
         // The exported functions of libibverbs and librdmacm that rsrdma-sys loads at run time.\n\
         \n\
         use crate::bindings::*;\n\
         use crate::dynamic::dynamic_functions;\n\
         \n\
         dynamic_functions! {\n",
    );
    let mut found = Vec::new();
    let mut rest = decls;
    while let Some(at) = rest.find("pub fn ") {
        let tail = &rest[at + "pub fn ".len()..];
        let end = tail
            .find(';')
            .context("a declaration without its semicolon")?;
        let sig = tail[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        let sig = sig.replace("( ", "(").replace(", )", ")");
        let name = sig[..sig.find('(').context("a declaration without arguments")?].to_owned();
        let lib = if name.starts_with("rdma_") {
            "rdmacm"
        } else {
            "ibverbs"
        };
        out.push_str(&format!("    {lib}: fn {sig};\n"));
        found.push(name);
        rest = &tail[end..];
    }
    out.push_str("}\n");
    for f in DYNAMIC_FUNCTIONS {
        anyhow::ensure!(
            found.iter().any(|n| n == f),
            "bindgen found no declaration of {f}"
        );
    }
    Ok(out)
}
