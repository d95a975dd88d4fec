//! Builds for the test stages, all with the unit stage's selection of targets.
//!
//! `cargo xtask test` first runs `cargo test --workspace --all-features`. Every later build of
//! the run (the device tests for soft0 and for the VM, the examples) asks cargo for that same
//! selection plus what it needs: cargo then resolves the same features and reuses every
//! library the unit stage compiled, and links only the new executables. A narrower selection
//! (`cargo test -p rsrdma --test device`, `cargo build -p rsrdma-net --example …`) resolved
//! other features for shared dependencies (`tracing`, `thiserror`) and built the workspace's
//! crates again for each package: about two minutes of a CI run.

use crate::vm;
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The workspace's integration-test targets in `cargo metadata`, each with its package:
/// those `cargo test` runs, and the device tests (declared with `test = false`).
pub fn integration_tests(
    metadata: &serde_json::Value,
) -> impl Iterator<Item = (&serde_json::Value, &serde_json::Value)> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |t| (p, t))
        })
        .filter(|(_, t)| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
}

/// Whether `cargo test` runs integration-test target `t` (it is not declared `test = false`).
pub fn runs_in_cargo_test(t: &serde_json::Value) -> bool {
    t["test"] != serde_json::Value::Bool(false)
}

/// The names of the workspace's integration tests that `cargo test` runs.
fn unit_tests(metadata: &serde_json::Value) -> Vec<&str> {
    integration_tests(metadata)
        .filter(|(_, t)| runs_in_cargo_test(t))
        .filter_map(|(_, t)| t["name"].as_str())
        .collect()
}

/// One executable cargo built.
#[derive(Debug, Clone)]
pub struct Artifact {
    /// The directory of its package's Cargo.toml.
    pub manifest_dir: PathBuf,
    /// The target's name (`device`, `echo-msg`).
    pub name: String,
    /// The target's kind (`test`, `example`, `bin`, `lib`).
    pub kind: String,
    pub exe: PathBuf,
}

/// Builds the unit stage's selection plus the test targets `tests` (targets declared with
/// `test = false`, which `cargo test` leaves out) with `cargo test --no-run`, and returns every
/// executable cargo reported (the examples among them, built as programs, at
/// `target/debug/examples/NAME`, only when `tests` is empty). `metadata` is the workspace's
/// `cargo metadata`. With `hide_rdma_core`, cargo runs in the namespace where rdma-core's
/// libraries and headers are hidden (`no_rdma_core.rs`).
pub fn with_unit_selection(
    root: &Path,
    metadata: &serde_json::Value,
    tests: &[&str],
    hide_rdma_core: bool,
) -> Result<Vec<Artifact>> {
    let mut cmd = Command::new(vm::cargo());
    cmd.args([
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
        "--workspace",
        "--all-features",
    ])
    .current_dir(root);
    if !tests.is_empty() {
        // Naming a target drops cargo's default selection, so it is named kind by kind, but
        // not with `--tests` (it overrides every `--test NAME`) nor `--examples` (it builds
        // them as tests; they bring no dependency the tests do not).
        cmd.args(["--lib", "--bins"]);
        let mut names: Vec<&str> = unit_tests(metadata);
        names.extend_from_slice(tests);
        names.sort_unstable();
        names.dedup();
        for t in names {
            cmd.args(["--test", t]);
        }
    }
    if hide_rdma_core {
        cmd = crate::no_rdma_core::wrap(&cmd)?;
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed");
    }
    Ok(artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// The executables in cargo's JSON messages.
fn artifacts(json: &str) -> Vec<Artifact> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            let manifest = Path::new(m["manifest_path"].as_str()?);
            Some(Artifact {
                manifest_dir: manifest.parent()?.to_path_buf(),
                name: m["target"]["name"].as_str()?.to_string(),
                kind: m["target"]["kind"][0].as_str()?.to_string(),
                exe: PathBuf::from(exe),
            })
        })
        .collect()
}

/// The directory of `package`'s Cargo.toml, from `cargo metadata`.
pub fn manifest_dir_of(metadata: &serde_json::Value, package: &str) -> Result<PathBuf> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == package)
        .and_then(|p| {
            Path::new(p["manifest_path"].as_str()?)
                .parent()
                .map(Path::to_path_buf)
        })
        .ok_or_else(|| anyhow!("cargo metadata names no package {package}"))
}

/// The executable of `kind` target `name` of the package in `manifest_dir`.
pub fn find<'a>(
    built: &'a [Artifact],
    manifest_dir: &Path,
    kind: &str,
    name: &str,
) -> Result<&'a Artifact> {
    built
        .iter()
        .find(|a| a.kind == kind && a.name == name && a.manifest_dir == manifest_dir)
        .ok_or_else(|| {
            anyhow!(
                "cargo reported no executable for {kind} {name} of {}",
                manifest_dir.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_stages_integration_tests_are_those_cargo_test_runs() {
        let metadata = serde_json::json!({"packages": [{
            "name": "a",
            "manifest_path": "/w/crates/a/Cargo.toml",
            "targets": [
                {"name": "a", "kind": ["lib"], "test": true},
                {"name": "device", "kind": ["test"], "test": false},
                {"name": "unit", "kind": ["test"], "test": true},
                {"name": "demo", "kind": ["example"], "test": false}
            ]
        }, {
            "name": "b",
            "manifest_path": "/w/crates/b/Cargo.toml",
            "targets": [{"name": "codec", "kind": ["test"], "test": true}]
        }]});
        assert_eq!(unit_tests(&metadata), vec!["unit", "codec"]);
    }

    #[test]
    fn artifacts_are_told_apart_by_package_and_kind() {
        let json = r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/a/Cargo.toml","target":{"name":"device","kind":["test"]},"executable":"/w/target/debug/deps/device-1"}
{"reason":"compiler-artifact","manifest_path":"/w/crates/b/Cargo.toml","target":{"name":"device","kind":["test"]},"executable":"/w/target/debug/deps/device-2"}
{"reason":"compiler-artifact","manifest_path":"/w/crates/b/Cargo.toml","target":{"name":"b","kind":["lib"]},"executable":null}
{"reason":"compiler-message","message":{}}
{"reason":"compiler-artifact","manifest_path":"/w/crates/b/Cargo.toml","target":{"name":"echo-msg","kind":["example"]},"executable":"/w/target/debug/examples/echo_msg-3"}"#;
        let built = artifacts(json);
        assert_eq!(built.len(), 3);
        let b = Path::new("/w/crates/b");
        let dev = find(&built, b, "test", "device").unwrap();
        assert_eq!(dev.exe, Path::new("/w/target/debug/deps/device-2"));
        let ex = find(&built, b, "example", "echo-msg").unwrap();
        assert_eq!(ex.exe, Path::new("/w/target/debug/examples/echo_msg-3"));
        assert!(find(&built, b, "test", "echo-msg").is_err());
        assert!(find(&built, Path::new("/w/crates/c"), "test", "device").is_err());
    }
}
