//! rs_registry: the UD name registry as a process.
//!
//! ```text
//! rs_registry [--listen ADDR] [--secret-file PATH] [--lease SECS] [--max-entries N]
//!             [--max-clients N]
//! ```
//! The secret comes from `--secret-file` (trailing newline ignored) or the environment
//! variable `RS_REGISTRY_SECRET`; without either the registry does not authenticate.
//! It serves until killed.

use rsrdma_net::{Registry, RegistryOptions};
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: rs_registry [--listen ADDR (default 0.0.0.0:9100)] \
[--secret-file PATH] [--lease SECS (default 30)] [--max-entries N (default 4096)] \
[--max-clients N (default 64)]\n\
the secret may also come from the environment variable RS_REGISTRY_SECRET";

/// What the command line asked for.
struct Args {
    listen: String,
    opts: RegistryOptions,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut listen = "0.0.0.0:9100".to_string();
    let mut opts = RegistryOptions::default();
    let mut secret_file = None;
    while let Some(flag) = argv.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" | "-l" => listen = value()?,
            "--secret-file" => secret_file = Some(value()?),
            "--lease" => {
                let secs = number(&flag, &value()?)?;
                // Any length is accepted; the registry clamps what it cannot represent.
                opts = opts.lease(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
            }
            "--max-entries" => opts = opts.max_entries(number(&flag, &value()?)? as usize),
            "--max-clients" => opts = opts.max_clients(number(&flag, &value()?)? as usize),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    // Trimmed as a library client's `Secret::from_file` trims, so both read one file alike.
    let secret = match secret_file {
        Some(path) => Some(rsrdma_net::Secret::from_file(&path).map_err(|e| e.to_string())?),
        None => std::env::var_os("RS_REGISTRY_SECRET")
            .map(|s| rsrdma_net::Secret::from_text(s.into_encoded_bytes())),
    };
    if let Some(s) = &secret {
        s.check("the secret").map_err(|e| e.to_string())?;
    }
    Ok(Args {
        listen,
        opts: opts.secret(secret),
    })
}

fn number(flag: &str, v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
        _ => Err(format!("{flag} takes a positive number, not {v:?}")),
    }
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("rs_registry: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let auth = args.opts.secret.is_some();
    let lease = args.opts.lease;
    match Registry::serve_with(&args.listen, args.opts) {
        Ok(handle) => {
            println!(
                "rs_registry listening on {} (lease {:?}, authentication {})",
                handle.local_addr(),
                lease,
                if auth { "on" } else { "off" }
            );
            loop {
                std::thread::park();
            }
        }
        Err(e) => {
            eprintln!("rs_registry: {e}");
            ExitCode::FAILURE
        }
    }
}
