//! [`EtcdDirectory`]: the registry's semantics on etcd, for clusters that outgrow one
//! registry process.
//!
//! It speaks etcd's v3 API through etcd's JSON gateway (HTTP/1.1 on the client port, on by
//! default), with no gRPC stack: one short connection per request, so a restarted etcd is
//! simply reached again. The semantics are the built-in server's:
//!
//! - **Leases are etcd leases.** A registration grants a lease of the asked length (whole
//!   seconds, at least one) and attaches the name to it; registering again keeps the lease
//!   alive (`LeaseKeepAlive`); when it runs out, etcd deletes the name.
//! - **Ownership.** Next to `<prefix>names/<name>` (the address) lives
//!   `<prefix>owners/<name>` (the owner), both on the same lease. Every write is a
//!   transaction that compares the owner first, so another owner's register or unregister
//!   fails with [`ErrorCode::NotOwner`] and changes nothing.
//! - **Lookups and watches** read `<prefix>names/<name>` ([`Directory::watch`] looks again
//!   every [`super::WATCH_POLL`]).
//!
//! Values: the address is 24 bytes (GID, QPN and Q_Key, big-endian); the owner 16 bytes.
//! Authentication and TLS are etcd's own (not configured here: use etcd on a trusted network
//! or behind its client-certificate setup; see the guide's security chapter).

mod b64;
mod http;

use super::codec::OWNER_LEN;
use super::directory::Directory;
use super::{check_name, ErrorCode};
use crate::error::{NetError, Result};
use crate::packet::Addr;
use rsrdma::option_setters as setters;
use rsrdma::Gid;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Options of [`EtcdDirectory::connect`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// Limit of each request. Default 5 s.
    pub timeout: Duration,
    /// Where the directory's keys live in etcd's key space. Default `rsrdma/registry/`.
    pub prefix: String,
    /// The lease of a registration that asks for none, and the longest granted. Default 30 s.
    pub lease: Duration,
    /// Who this client registers names as (as [`super::ClientOptions::owner`]); `None`:
    /// random.
    pub owner: Option<[u8; OWNER_LEN]>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            timeout: Duration::from_secs(5),
            prefix: "rsrdma/registry/".into(),
            lease: Duration::from_secs(30),
            owner: None,
        }
    }
}

setters!(EtcdOptions {
    /// Sets [`EtcdOptions::timeout`].
    timeout: Duration,
    /// Sets [`EtcdOptions::prefix`].
    prefix: String,
    /// Sets [`EtcdOptions::lease`].
    lease: Duration,
    /// Sets [`EtcdOptions::owner`].
    owner: Option<[u8; OWNER_LEN]>,
});

/// A directory on etcd. See the module docs.
#[derive(Debug)]
pub struct EtcdDirectory {
    endpoints: Vec<SocketAddr>,
    opts: EtcdOptions,
    owner: [u8; OWNER_LEN],
    /// The lease of each name this client registered: (id, seconds).
    leases: HashMap<String, (i64, u64)>,
}

impl EtcdDirectory {
    /// A directory on the etcd cluster at `endpoints` (client URLs' `host:port`; each is
    /// tried in turn), checked with a status request.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for an empty prefix, a zero lease or timeout, or no
    /// address; connection errors, or [`NetError::Registry`] with [`ErrorCode::Busy`], when
    /// no endpoint can serve (every later call tries the endpoints in the same way);
    /// [`NetError::EtcdReply`] for a reply that cannot be read.
    pub fn connect(endpoints: impl ToSocketAddrs, opts: EtcdOptions) -> Result<EtcdDirectory> {
        if opts.prefix.is_empty() || opts.lease.is_zero() || opts.timeout.is_zero() {
            return Err(NetError::InvalidArgument(
                "EtcdOptions: prefix, lease and timeout must not be empty or zero".into(),
            ));
        }
        let endpoints: Vec<SocketAddr> = endpoints
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve etcd's address", e))?
            .collect();
        if endpoints.is_empty() {
            return Err(NetError::InvalidArgument("no etcd endpoint".into()));
        }
        let owner = match opts.owner {
            Some(o) => o,
            None => super::client::random_owner()?,
        };
        let d = EtcdDirectory {
            endpoints,
            opts,
            owner,
            leases: HashMap::new(),
        };
        d.call("/v3/maintenance/status", &json!({}))?;
        Ok(d)
    }

    /// The first answer of an endpoint, in order. An endpoint that cannot serve now (no
    /// connection, a reply that is not HTTP, a 5xx status: no leader, leader changed,
    /// overloaded) passes the request to the next; a refusal (any other status) is final.
    ///
    /// # Errors
    /// [`NetError::Registry`] with [`ErrorCode::Busy`] when every endpoint was unavailable
    /// and the last answered 5xx, [`ErrorCode::BadRequest`] for a refusal; the last
    /// endpoint's connection error; [`NetError::EtcdReply`] for a reply that is not JSON.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let body = body.to_string();
        let mut last = None;
        for &at in &self.endpoints {
            let (status, text) = match http::post(at, path, &body, self.opts.timeout) {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::debug!(%at, error = %e, path, "etcd endpoint unavailable");
                    last = Some(e);
                    continue;
                }
            };
            if status == 200 {
                return serde_json::from_str(&text)
                    .map_err(|e| NetError::EtcdReply(format!("to {path}: {e}")));
            }
            let why = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or(text);
            let unavailable = (500..600).contains(&status);
            let e = NetError::Registry {
                code: if unavailable {
                    ErrorCode::Busy
                } else {
                    ErrorCode::BadRequest
                },
                message: format!("etcd at {at} refused {path} (HTTP {status}): {why}"),
            };
            if !unavailable {
                return Err(e);
            }
            tracing::debug!(%at, status, path, "etcd endpoint cannot serve now");
            last = Some(e);
        }
        Err(last.expect("at least one endpoint"))
    }

    fn key(&self, kind: &str, name: &str) -> String {
        b64::encode(format!("{}{kind}/{name}", self.opts.prefix).as_bytes())
    }

    fn grant(&self, secs: u64) -> Result<(i64, u64)> {
        let r = self.call("/v3/lease/grant", &json!({ "TTL": secs.to_string() }))?;
        let id = int(&r["ID"]).ok_or_else(|| etcd_says("no lease ID"))?;
        Ok((id, int(&r["TTL"]).unwrap_or(secs as i64).max(1) as u64))
    }

    /// Whether the lease is still alive (its TTL restarted).
    fn keep_alive(&self, id: i64) -> Result<bool> {
        let r = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        Ok(int(&r["result"]["TTL"]).unwrap_or(0) > 0)
    }

    fn revoke(&self, id: i64) {
        // Best effort: an expired or unknown lease is already gone.
        let _ = self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }));
    }

    /// Writes `name` → `addr` on `lease` if this client owns the name or nobody does.
    fn write_owned(&self, name: &str, addr: &Addr, lease: i64) -> Result<()> {
        let (owner_key, name_key) = (self.key("owners", name), self.key("names", name));
        let puts = json!([
            { "request_put": { "key": owner_key, "value": b64::encode(&self.owner), "lease": lease.to_string() } },
            { "request_put": { "key": name_key, "value": b64::encode(&encode_addr(addr)), "lease": lease.to_string() } },
        ]);
        let mine = json!({ "key": owner_key, "target": "VALUE", "result": "EQUAL", "value": b64::encode(&self.owner) });
        let free = json!({ "key": owner_key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" });
        for compare in [mine, free] {
            let r = self.call(
                "/v3/kv/txn",
                &json!({ "compare": [compare], "success": puts, "failure": [] }),
            )?;
            if r["succeeded"].as_bool() == Some(true) {
                return Ok(());
            }
        }
        Err(not_owner(name))
    }
}

impl Directory for EtcdDirectory {
    fn owner(&self) -> [u8; OWNER_LEN] {
        self.owner
    }

    fn register_for(&mut self, name: &str, addr: &Addr, lease: Duration) -> Result<Duration> {
        check_name(name)?;
        let want = if lease.is_zero() {
            self.opts.lease
        } else {
            lease.min(self.opts.lease)
        };
        let secs = want.as_secs_f64().ceil().max(1.0) as u64;
        let kept = match self.leases.get(name) {
            Some(&(id, ttl)) if ttl == secs && self.keep_alive(id)? => Some((id, ttl)),
            _ => None,
        };
        let (id, ttl) = match kept {
            Some(l) => l,
            None => self.grant(secs)?,
        };
        match self.write_owned(name, addr, id) {
            Ok(()) => {
                if let Some((old, _)) = self.leases.insert(name.to_owned(), (id, ttl)) {
                    if old != id {
                        self.revoke(old);
                    }
                }
                Ok(Duration::from_secs(ttl))
            }
            Err(e) => {
                if kept.is_none() {
                    self.revoke(id);
                }
                Err(e)
            }
        }
    }

    fn lookup(&mut self, name: &str) -> Result<Addr> {
        check_name(name)?;
        let r = self.call("/v3/kv/range", &json!({ "key": self.key("names", name) }))?;
        let value = r["kvs"][0]["value"]
            .as_str()
            .ok_or_else(|| not_found(name))?;
        b64::decode(value)
            .and_then(|b| decode_addr(&b))
            .ok_or_else(|| etcd_says("an address that is not 24 bytes"))
    }

    fn unregister(&mut self, name: &str) -> Result<()> {
        check_name(name)?;
        let (owner_key, name_key) = (self.key("owners", name), self.key("names", name));
        let r = self.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": owner_key, "target": "VALUE", "result": "EQUAL", "value": b64::encode(&self.owner) }],
                "success": [
                    { "request_delete_range": { "key": name_key } },
                    { "request_delete_range": { "key": owner_key } },
                ],
                "failure": [{ "request_range": { "key": owner_key, "count_only": true } }],
            }),
        )?;
        if r["succeeded"].as_bool() != Some(true) {
            let held = int(&r["responses"][0]["response_range"]["count"]).unwrap_or(0) > 0;
            return Err(if held {
                not_owner(name)
            } else {
                not_found(name)
            });
        }
        if let Some((id, _)) = self.leases.remove(name) {
            self.revoke(id);
        }
        Ok(())
    }
}

/// An int64 of etcd's JSON (a string, or a number).
fn int(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
}

fn etcd_says(what: &str) -> NetError {
    NetError::EtcdReply(format!("it holds {what}"))
}

fn not_owner(name: &str) -> NetError {
    NetError::Registry {
        code: ErrorCode::NotOwner,
        message: super::not_owner_text(name),
    }
}

fn not_found(name: &str) -> NetError {
    NetError::Registry {
        code: ErrorCode::NotFound,
        message: super::not_found_text(name),
    }
}

fn encode_addr(a: &Addr) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[..16].copy_from_slice(&a.gid.0);
    b[16..20].copy_from_slice(&a.qpn.to_be_bytes());
    b[20..].copy_from_slice(&a.qkey.to_be_bytes());
    b
}

fn decode_addr(b: &[u8]) -> Option<Addr> {
    let b: &[u8; 24] = b.try_into().ok()?;
    let gid = Gid(b[..16].try_into().ok()?);
    let qpn = u32::from_be_bytes(b[16..20].try_into().ok()?);
    let qkey = u32::from_be_bytes(b[20..].try_into().ok()?);
    Some(Addr { gid, qpn, qkey })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let a = Addr {
            gid: Gid([7; 16]),
            qpn: 0x12_3456,
            qkey: 0xdead_beef,
        };
        assert_eq!(decode_addr(&encode_addr(&a)), Some(a));
        assert_eq!(decode_addr(&[0; 23]), None);
    }
}
