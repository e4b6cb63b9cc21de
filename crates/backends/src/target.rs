//! [`Target`]: which lock service a URL names, checked before anything
//! connects, so that a typo is a clear refusal and not a hang or a lock taken
//! on the wrong system.
//!
//! One URL per backend, its scheme choosing it:
//!
//! - `http://HOST:PORT[,…]`, `https://…`: the Deadbolt server (its endpoints);
//! - `redis://[[USER]:PASSWORD@]HOST:PORT[/DB][?fence=counter]`: one Redis
//!   server (`AUTH PASSWORD`, or `AUTH USER PASSWORD` for an ACL user);
//!   `rediss://…[&ca=PATH]` the same over TLS (rustls), verified against the
//!   PEM CA file `PATH` or, without it, the system's roots;
//! - `redlock://[[USER]:PASSWORD@]HOST:PORT,…` (3 or more): Redlock over
//!   independent Redis masters, each entry with its own credentials (none
//!   inherited from another); `redlocks://…[?ca=PATH]`: TLS to every master;
//! - `etcd://[USER:PASSWORD@]HOST:PORT[,…]`: an etcd cluster's client
//!   endpoints, with one user for the cluster (etcd's users are
//!   cluster-wide); `etcds://…[?ca=PATH]` over TLS;
//! - `postgres://…` or `postgresql://…`: a PostgreSQL database, in
//!   libpq's URL form, with `sslmode=require|verify-ca|verify-full` and
//!   `sslrootcert=PATH` for TLS on rustls (plus `idle_session_timeout=off`,
//!   unsafe, to measure what the hung-holder protection prevents).
//!
//! Over 800 lines only with its tests (about 250): the parsing of five URL
//! forms, each with its TLS options, is about 640.

use crate::Backend;
use crate::Error;
use std::fmt;
use std::path::PathBuf;

/// The most servers one URL may list: a Deadbolt, etcd or Redlock
/// deployment is 3 to 7 nodes; more is a mistake (say, a pasted host list).
pub const MAX_NODES: usize = 15;

/// Redlock needs a majority of independent masters: with fewer than 3 one
/// failure loses it, and there is nothing to gain over one server.
pub const MIN_REDLOCK_NODES: usize = 3;

/// A parsed lock URL. Its `Debug` shows no password.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// The Deadbolt server, through `deadbolt-client`.
    Deadbolt { endpoints: Vec<String> },
    /// One Redis server; with `fence`, an `INCR`ed counter beside each lock.
    Redis { node: RedisNode, fence: bool },
    /// Redlock over these independent Redis masters.
    Redlock { nodes: Vec<RedisNode> },
    /// etcd's client endpoints, as `http://HOST:PORT` (`https://` with
    /// `tls`), and the user to authenticate as.
    Etcd {
        endpoints: Vec<String>,
        user: Option<(String, Secret)>,
        tls: Option<EtcdTls>,
    },
    /// A PostgreSQL connection URL (libpq's form, without our option).
    /// `idle_timeout: false` (`?idle_session_timeout=off`) leaves
    /// PostgreSQL's `idle_session_timeout` unset: a holder hung with its
    /// socket open then keeps its locks forever. Unsafe; it exists to
    /// measure what the timeout prevents (docs/backends.md).
    /// `tls`: `sslmode=require|verify-ca|verify-full` (rustls), with
    /// `sslrootcert=PATH`; both taken out of `url`.
    Postgres {
        url: String,
        idle_timeout: bool,
        tls: Option<PostgresTls>,
    },
}

/// TLS to etcd (`etcds://`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// A PEM file of the CA(s) to trust (`?ca=PATH`), instead of the
    /// system's roots.
    pub ca: Option<PathBuf>,
}

/// TLS to PostgreSQL, by libpq's `sslmode` and `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresTls {
    pub mode: SslMode,
    /// The PEM CA file to trust (`sslrootcert=PATH`); without it, the
    /// system's roots.
    pub ca: Option<PathBuf>,
}

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Encrypted, the certificate not checked (libpq's `require` without
    /// `sslrootcert`): no protection from an impostor in the middle.
    Require,
    /// The certificate must chain to the CA, for any host name (libpq's
    /// `verify-ca`, and `require` with `sslrootcert`).
    VerifyCa,
    /// The chain and the host name (libpq's `verify-full`).
    VerifyFull,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Deadbolt { endpoints } => f
                .debug_struct("Deadbolt")
                .field("endpoints", endpoints)
                .finish(),
            Target::Redis { node, fence } => f
                .debug_struct("Redis")
                .field("node", node)
                .field("fence", fence)
                .finish(),
            Target::Redlock { nodes } => f.debug_struct("Redlock").field("nodes", nodes).finish(),
            Target::Etcd {
                endpoints,
                user,
                tls,
            } => f
                .debug_struct("Etcd")
                .field("endpoints", endpoints)
                .field("user", user)
                .field("tls", tls)
                .finish(),
            Target::Postgres {
                url,
                idle_timeout,
                tls,
            } => f
                .debug_struct("Postgres")
                .field("url", &redact(url))
                .field("idle_timeout", idle_timeout)
                .field("tls", tls)
                .finish(),
        }
    }
}

/// A password from a lock URL: shown as `***` by `Debug`, and never put in
/// a message.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// One Redis server of a `redis(s)://` or `redlock(s)://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisNode {
    pub host: String,
    pub port: u16,
    pub db: u8,
    /// An ACL user (`AUTH USER PASSWORD`); `None` with a password is the
    /// `default` user (`AUTH PASSWORD`, `requirepass`).
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// TLS (`rediss://`, `redlocks://`), and how to verify the server.
    pub tls: Option<RedisTls>,
}

/// How a TLS connection to Redis verifies the server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisTls {
    /// A PEM file of the CA(s) to trust (`?ca=PATH`), instead of the
    /// system's roots.
    pub ca: Option<PathBuf>,
}

/// The server as messages name it: its URL with the password as `***`.
impl fmt::Display for RedisNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (None, Some(_)) => f.write_str(":***@")?,
            _ => {}
        }
        write!(f, "{}:{}", self.host, self.port)?;
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

const SCHEMES: &str = "http(s)://, redis(s)://, redlock(s)://, etcd(s)://, postgres://";

impl Target {
    /// The lock system it names.
    pub fn backend(&self) -> Backend {
        match self {
            Target::Deadbolt { .. } => Backend::Deadbolt,
            Target::Redis { .. } => Backend::Redis,
            Target::Redlock { .. } => Backend::Redlock,
            Target::Etcd { .. } => Backend::Etcd,
            Target::Postgres { .. } => Backend::Postgres,
        }
    }

    pub fn parse(url: &str) -> Result<Target, Error> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(Error::invalid(format!(
                "{:?} is not a lock URL: it has no scheme (want one of {SCHEMES})",
                redact(url)
            )));
        };
        let refuse = |why: String| Error::invalid(format!("lock URL {:?}: {why}", redact(url)));
        match scheme.to_ascii_lowercase().as_str() {
            "http" | "https" => {
                let endpoints = hosts(rest).map_err(refuse)?;
                Ok(Target::Deadbolt {
                    endpoints: endpoints
                        .into_iter()
                        .map(|host| format!("{scheme}://{host}"))
                        .collect(),
                })
            }
            "redis" | "rediss" => {
                let tls = scheme.eq_ignore_ascii_case("rediss");
                let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
                let options = redis_options(query, tls).map_err(refuse)?;
                let (address, db) = address.split_once('/').unwrap_or((address, ""));
                let db = match db {
                    "" => 0,
                    db => db
                        .parse::<u8>()
                        .map_err(|_| refuse(format!("database {db:?} is not a number")))?,
                };
                if host_list(address).len() > 1 {
                    return Err(refuse(format!(
                        "{scheme}:// takes one server; for several independent masters use \
                         redlock{}://HOST:PORT,HOST:PORT,HOST:PORT",
                        if tls { "s" } else { "" }
                    )));
                }
                let mut node = redis_node(address).map_err(refuse)?;
                node.tls = tls.then_some(RedisTls { ca: options.ca });
                node.db = db;
                Ok(Target::Redis {
                    node,
                    fence: options.fence,
                })
            }
            "redlock" | "redlocks" => {
                let tls = scheme.eq_ignore_ascii_case("redlocks");
                let (list, query) = rest.split_once('?').unwrap_or((rest, ""));
                let options = redis_options(query, tls).map_err(refuse)?;
                if options.fence {
                    return Err(refuse(
                        "Redlock has no counter (?fence=counter is redis://'s); its masters \
                         agree on no number"
                            .into(),
                    ));
                }
                let entries = host_list(list.trim_end_matches('/'));
                let nodes = entries
                    .iter()
                    .map(|entry| {
                        let mut node = redis_node(entry)?;
                        node.tls = tls.then(|| RedisTls {
                            ca: options.ca.clone(),
                        });
                        Ok(node)
                    })
                    .collect::<Result<Vec<_>, String>>()
                    .map_err(refuse)?;
                check_count(
                    nodes
                        .iter()
                        .map(|node| format!("{}:{}", node.host, node.port)),
                )
                .map_err(refuse)?;
                if nodes.len() < MIN_REDLOCK_NODES {
                    return Err(refuse(format!(
                        "Redlock needs at least {MIN_REDLOCK_NODES} independent Redis masters \
                         (got {}); for one server use redis://HOST:PORT",
                        nodes.len()
                    )));
                }
                Ok(Target::Redlock { nodes })
            }
            "etcd" | "etcds" => {
                let tls = scheme.eq_ignore_ascii_case("etcds");
                let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
                let ca = etcd_options(query, tls).map_err(refuse)?;
                let (user, list) = match main.rsplit_once('@') {
                    None => (None, main),
                    Some((userinfo, list)) => (Some(etcd_user(userinfo).map_err(refuse)?), list),
                };
                let endpoints = hosts(list).map_err(refuse)?;
                let prefix = if tls { "https" } else { "http" };
                Ok(Target::Etcd {
                    endpoints: endpoints
                        .into_iter()
                        .map(|host| format!("{prefix}://{host}"))
                        .collect(),
                    user,
                    tls: tls.then_some(EtcdTls { ca }),
                })
            }
            "postgres" | "postgresql" => {
                let (url, idle_timeout) = match take_param(url, IDLE_TIMEOUT_OFF) {
                    Some(rest) => (rest, false),
                    None => (url.to_owned(), true),
                };
                let (url, sslmode) = take_named(&url, "sslmode");
                let (url, ca) = take_named(&url, "sslrootcert");
                let ca = ca
                    .map(|ca| percent_decode(&ca).map(PathBuf::from))
                    .transpose()
                    .map_err(refuse)?;
                let tls = match (sslmode.as_deref(), ca) {
                    (None | Some("disable"), None) => None,
                    (None | Some("disable"), Some(_)) => {
                        return Err(refuse(
                            "sslrootcert= is for TLS: add sslmode=verify-full (or verify-ca, \
                             require)"
                                .into(),
                        ))
                    }
                    // libpq: `require` with a root CA file checks the chain.
                    (Some("require"), Some(ca)) => Some(PostgresTls {
                        mode: SslMode::VerifyCa,
                        ca: Some(ca),
                    }),
                    (Some("require"), None) => Some(PostgresTls {
                        mode: SslMode::Require,
                        ca: None,
                    }),
                    (Some("verify-ca"), ca) => Some(PostgresTls {
                        mode: SslMode::VerifyCa,
                        ca,
                    }),
                    (Some("verify-full"), ca) => Some(PostgresTls {
                        mode: SslMode::VerifyFull,
                        ca,
                    }),
                    (Some(other), _) => {
                        return Err(refuse(format!(
                            "sslmode={other:?} is not supported: say disable, require, \
                             verify-ca or verify-full (prefer and allow would fall back to \
                             plain TCP unnoticed)"
                        )))
                    }
                };
                url.parse::<tokio_postgres::Config>()
                    .map_err(|err| refuse(err.to_string()))?;
                Ok(Target::Postgres {
                    url,
                    idle_timeout,
                    tls,
                })
            }
            other => Err(Error::invalid(format!(
                "lock URL {:?}: unknown scheme {other:?} (want one of {SCHEMES})",
                redact(url)
            ))),
        }
    }
}

/// The PostgreSQL URL option that turns the hung-holder protection off.
const IDLE_TIMEOUT_OFF: &str = "idle_session_timeout=off";

/// `url` without the query parameter `param` (exactly `name=value`), if it
/// has it.
fn take_param(url: &str, param: &str) -> Option<String> {
    let (base, query) = url.split_once('?')?;
    let kept: Vec<&str> = query.split('&').filter(|p| *p != param).collect();
    if kept.len() == query.split('&').count() {
        return None;
    }
    Some(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

/// `url` without its query parameter `name=VALUE` (the last one if
/// repeated), and VALUE.
fn take_named(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|param| match param.split_once('=') {
            Some((key, found)) if key == name => {
                value = Some(found.to_owned());
                false
            }
            _ => true,
        })
        .collect();
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, value)
}

/// A comma-separated list of `HOST:PORT`, at most [`MAX_NODES`] of them,
/// none repeated.
fn hosts(list: &str) -> Result<Vec<String>, String> {
    let hosts = host_list(list.trim_end_matches('/'));
    for host in &hosts {
        host_port(host)?;
    }
    check_count(hosts.iter().cloned())?;
    Ok(hosts)
}

fn host_list(list: &str) -> Vec<String> {
    list.split(',').map(str::to_owned).collect()
}

/// At most [`MAX_NODES`] servers, none listed twice.
fn check_count(hosts: impl Iterator<Item = String>) -> Result<(), String> {
    let hosts: Vec<String> = hosts.collect();
    if hosts.len() > MAX_NODES {
        return Err(format!(
            "{} servers listed; at most {MAX_NODES}",
            hosts.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = hosts.iter().find(|host| !seen.insert(host.as_str())) {
        return Err(format!("{twice:?} is listed twice"));
    }
    Ok(())
}

/// One `HOST:PORT`.
fn host_port(host: &str) -> Result<(String, u16), String> {
    let Some((name, port)) = host.rsplit_once(':') else {
        return Err(format!("{host:?} has no port (want HOST:PORT)"));
    };
    if name.is_empty() || name.contains('/') || name.contains('@') {
        return Err(format!("{host:?} is not HOST:PORT"));
    }
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok((name.to_owned(), port)),
        _ => Err(format!(
            "{host:?}: port {port:?} is not a number in 1..65535"
        )),
    }
}

/// The `?ca=PATH` of an `etcds://` URL (its only option).
fn etcd_options(query: &str, tls: bool) -> Result<Option<PathBuf>, String> {
    let mut ca = None;
    for param in query.split('&').filter(|param| !param.is_empty()) {
        match param.split_once('=') {
            Some(("ca", path)) if tls && !path.is_empty() => {
                ca = Some(PathBuf::from(percent_decode(path)?))
            }
            Some(("ca", _)) if tls => return Err("?ca= needs a path to a PEM file".into()),
            Some(("ca", _)) => {
                return Err("?ca= is for TLS: use etcds:// to connect with TLS".into())
            }
            _ => {
                return Err(format!(
                    "unknown option {param:?} (the only one is ca=PATH, with etcds://)"
                ))
            }
        }
    }
    Ok(ca)
}

/// `USER:PASSWORD` before an etcd URL's first host.
fn etcd_user(userinfo: &str) -> Result<(String, Secret), String> {
    if userinfo.contains(',') {
        return Err(
            "the user goes once, before the first host (etcd's users are \
                    cluster-wide): etcd://USER:PASSWORD@HOST:PORT,HOST:PORT"
                .to_owned(),
        );
    }
    match userinfo.split_once(':') {
        Some((user, password)) if !user.is_empty() && !password.is_empty() => {
            Ok((percent_decode(user)?, Secret(percent_decode(password)?)))
        }
        _ => Err("etcd authenticates a user with its password: USER:PASSWORD@".to_owned()),
    }
}

/// The options of a `redis(s)://` or `redlock(s)://` URL.
struct RedisOptions {
    fence: bool,
    ca: Option<PathBuf>,
}

fn redis_options(query: &str, tls: bool) -> Result<RedisOptions, String> {
    let mut options = RedisOptions {
        fence: false,
        ca: None,
    };
    for param in query.split('&').filter(|param| !param.is_empty()) {
        match param.split_once('=') {
            Some(("fence", "counter")) => options.fence = true,
            Some(("ca", path)) if tls && !path.is_empty() => {
                options.ca = Some(PathBuf::from(percent_decode(path)?))
            }
            Some(("ca", _)) if tls => return Err("?ca= needs a path to a PEM file".into()),
            Some(("ca", _)) => {
                return Err(
                    "?ca= is for TLS: use rediss:// (or redlocks://) to connect with TLS".into(),
                )
            }
            _ => {
                return Err(format!(
                    "unknown option {param:?} (the options are fence=counter{})",
                    if tls {
                        " and ca=PATH"
                    } else {
                        ", and ca=PATH with rediss://"
                    }
                ))
            }
        }
    }
    Ok(options)
}

/// `[[USER]:PASSWORD@]HOST:PORT`, without TLS and on database 0.
fn redis_node(entry: &str) -> Result<RedisNode, String> {
    let (userinfo, address) = match entry.rsplit_once('@') {
        Some((userinfo, address)) => (Some(userinfo), address),
        None => (None, entry),
    };
    let (host, port) = host_port(address)?;
    let (username, password) = match userinfo {
        None => (None, None),
        Some(userinfo) => {
            let Some((user, password)) = userinfo.split_once(':') else {
                return Err(format!(
                    "{address:?}: a user without a password; Redis authenticates with \
                     USER:PASSWORD@ (an ACL user) or :PASSWORD@ (requirepass)"
                ));
            };
            if password.is_empty() {
                return Err(format!(
                    "{address:?}: the password is empty (want USER:PASSWORD@ or :PASSWORD@)"
                ));
            }
            let user = (!user.is_empty())
                .then(|| percent_decode(user))
                .transpose()?;
            (user, Some(Secret(percent_decode(password)?)))
        }
    };
    Ok(RedisNode {
        host,
        port,
        db: 0,
        username,
        password,
        tls: None,
    })
}

/// `%XX` escapes decoded (a password with `@`, `:`, `,` or `/` must be
/// written with them). The error never shows the text: it may be a secret.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or("a bad %-escape in the user, password or path (want %XX, two hex digits)")?;
            out.push(hex);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a %-escape that is not UTF-8".to_owned())
}

/// `url` as it may be shown: every password in it (`USER:PASSWORD@` of
/// each listed server, a `password=` option) replaced by `***`.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (main, query) = match rest.split_once('?') {
        Some((main, query)) => (main, Some(query)),
        None => (rest, None),
    };
    let main: Vec<String> = main
        .split(',')
        .map(|entry| match entry.rsplit_once('@') {
            Some((userinfo, after)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{after}"),
                None => entry.to_owned(),
            },
            None => entry.to_owned(),
        })
        .collect();
    let mut out = String::new();
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&main.join(","));
    if let Some(query) = query {
        let query: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&query.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        host: &str,
        port: u16,
        username: Option<&str>,
        password: Option<&str>,
        ca: Option<Option<&str>>,
    ) -> RedisNode {
        RedisNode {
            host: host.into(),
            port,
            db: 0,
            username: username.map(Into::into),
            password: password.map(Secret::new),
            tls: ca.map(|ca| RedisTls {
                ca: ca.map(PathBuf::from),
            }),
        }
    }

    impl Target {
        fn with_db(mut self, db: u8) -> Target {
            if let Target::Redis { node, .. } = &mut self {
                node.db = db;
            }
            self
        }
    }

    #[test]
    fn redis_urls_carry_credentials_and_tls() {
        assert_eq!(
            Target::parse("redis://:s3cret@h:1").unwrap(),
            Target::Redis {
                node: node("h", 1, None, Some("s3cret"), None),
                fence: false
            }
        );
        // A password with reserved characters is %-escaped; the last @
        // ends the credentials.
        assert_eq!(
            Target::parse(
                "rediss://app:p%40ss%2Cw%3Ard@h:1/3?ca=/etc/ca%20dir/ca.pem&fence=counter"
            )
            .unwrap(),
            Target::Redis {
                node: node(
                    "h",
                    1,
                    Some("app"),
                    Some("p@ss,w:rd"),
                    Some(Some("/etc/ca dir/ca.pem"))
                ),
                fence: true
            }
            .with_db(3)
        );
        assert_eq!(
            Target::parse("rediss://h:1").unwrap(),
            Target::Redis {
                node: node("h", 1, None, None, Some(None)),
                fence: false
            }
        );
        // Redlock: each master's own credentials, none inherited; TLS for all.
        assert_eq!(
            Target::parse("redlocks://:a@x:1,u:b@y:2,z:3?ca=/ca.pem").unwrap(),
            Target::Redlock {
                nodes: vec![
                    node("x", 1, None, Some("a"), Some(Some("/ca.pem"))),
                    node("y", 2, Some("u"), Some("b"), Some(Some("/ca.pem"))),
                    node("z", 3, None, None, Some(Some("/ca.pem"))),
                ]
            }
        );
    }

    #[test]
    fn passwords_stay_out_of_debug_display_and_refusals() {
        let target = Target::parse("rediss://app:hunter2@h:1/2").unwrap();
        assert!(!format!("{target:?}").contains("hunter2"), "{target:?}");
        let Target::Redis { node, .. } = &target else {
            panic!("{target:?}")
        };
        assert_eq!(node.to_string(), "rediss://app:***@h:1/2");
        let target = Target::parse("postgres://app:hunter2@h:5432/db").unwrap();
        assert!(!format!("{target:?}").contains("hunter2"), "{target:?}");
        for url in [
            "redis://:hunter2@h:1?fence=yes",
            "redis://u:hunter2@h",
            "redlock://:hunter2@a:1,:hunter2@b:1",
            "etcd://u:hunter2@a:1,u:hunter2@b:2",
            "etcds://u:hunter2@a:1?x=1",
            "mysql://u:hunter2@h:1",
            "u:hunter2@h:1",
            "postgres://u:hunter2@h:notaport/db",
            "postgres://h:notaport/db?password=hunter2",
        ] {
            let message = refusal(url);
            assert!(!message.contains("hunter2"), "{url}: {message}");
            assert!(message.contains("***"), "{url}: {message}");
        }
    }

    fn refusal(url: &str) -> String {
        let error = Target::parse(url).expect_err(url);
        assert_eq!(error.kind(), crate::ErrorKind::InvalidArgument, "{url}");
        error.to_string()
    }

    #[test]
    fn each_scheme_selects_its_backend() {
        assert_eq!(
            Target::parse("http://a:1,b:2").unwrap(),
            Target::Deadbolt {
                endpoints: vec!["http://a:1".into(), "http://b:2".into()]
            }
        );
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/2?fence=counter").unwrap(),
            Target::Redis {
                node: node("127.0.0.1", 6379, None, None, None),
                fence: true
            }
            .with_db(2)
        );
        assert_eq!(
            Target::parse("redlock://a:1,b:1,c:1").unwrap(),
            Target::Redlock {
                nodes: vec![
                    node("a", 1, None, None, None),
                    node("b", 1, None, None, None),
                    node("c", 1, None, None, None),
                ]
            }
        );
        assert_eq!(
            Target::parse("etcd://e:2379").unwrap(),
            Target::Etcd {
                endpoints: vec!["http://e:2379".into()],
                user: None,
                tls: None
            }
        );
        assert_eq!(
            Target::parse("etcds://root:p%40ss@e:1,f:2?ca=/ca.pem").unwrap(),
            Target::Etcd {
                endpoints: vec!["https://e:1".into(), "https://f:2".into()],
                user: Some(("root".into(), Secret::new("p@ss"))),
                tls: Some(EtcdTls {
                    ca: Some("/ca.pem".into())
                })
            }
        );
        assert!(matches!(
            Target::parse("postgresql://u:p@h:5432/db").unwrap(),
            Target::Postgres {
                idle_timeout: true,
                ..
            }
        ));
        assert_eq!(
            Target::parse("postgres://u@h:1/db?connect_timeout=3&idle_session_timeout=off")
                .unwrap(),
            Target::Postgres {
                url: "postgres://u@h:1/db?connect_timeout=3".into(),
                idle_timeout: false,
                tls: None
            }
        );
        assert_eq!(
            Target::parse("postgres://u:p@h:1/db?sslmode=verify-full&sslrootcert=/ca%20s.pem")
                .unwrap(),
            Target::Postgres {
                url: "postgres://u:p@h:1/db".into(),
                idle_timeout: true,
                tls: Some(PostgresTls {
                    mode: SslMode::VerifyFull,
                    ca: Some("/ca s.pem".into())
                })
            }
        );
        for (query, mode, ca) in [
            ("sslmode=require", SslMode::Require, None),
            (
                "sslmode=require&sslrootcert=/c",
                SslMode::VerifyCa,
                Some("/c"),
            ),
            ("sslmode=verify-ca", SslMode::VerifyCa, None),
        ] {
            let Target::Postgres { tls, .. } =
                Target::parse(&format!("postgres://h:1/db?{query}")).unwrap()
            else {
                panic!("{query}")
            };
            assert_eq!(
                tls,
                Some(PostgresTls {
                    mode,
                    ca: ca.map(PathBuf::from)
                }),
                "{query}"
            );
        }
    }

    #[test]
    fn refusals_name_the_problem_and_the_fix() {
        for (url, says) in [
            ("localhost:6379", "no scheme"),
            ("mysql://h:1", "unknown scheme \"mysql\""),
            ("redis://h", "has no port"),
            ("redis://h:99999", "not a number in 1..65535"),
            ("redis://h:1?fence=yes", "the options are fence=counter"),
            ("redis://h:1?ca=/x.pem", "use rediss://"),
            ("rediss://h:1?ca=", "needs a path"),
            ("redis://user@h:1", "a user without a password"),
            ("redis://:@h:1", "the password is empty"),
            ("redis://:p%zz@h:1", "bad %-escape"),
            ("rediss://a:1,b:2", "use redlocks://"),
            (
                "redlock://a:1,b:1,c:1?fence=counter",
                "Redlock has no counter",
            ),
            ("redlock://:x@a:1,:y@a:1,b:2", "listed twice"),
            ("redis://a:1,b:2", "use redlock://"),
            (
                "redlock://a:1,b:2",
                "at least 3 independent Redis masters (got 2)",
            ),
            ("redlock://a:1,a:1,b:2", "listed twice"),
            ("etcd://", "has no port"),
            ("etcd://u:p@a:1,u:p@b:2", "the user goes once"),
            (":p@a:1", "no scheme"),
            ("etcd://:p@a:1", "USER:PASSWORD@"),
            ("etcd://a:1?ca=/c.pem", "use etcds://"),
            ("postgres://h:notaport/db", "lock URL"),
            ("postgres://h:1/db?sslmode=prefer", "say disable, require"),
            (
                "postgres://h:1/db?sslrootcert=/c.pem",
                "add sslmode=verify-full",
            ),
        ] {
            let message = refusal(url);
            assert!(message.contains(says), "{url}: {message}");
        }
        let many = (1..=16).map(|i| format!("h{i}:1")).collect::<Vec<_>>();
        assert!(refusal(&format!("etcd://{}", many.join(","))).contains("at most 15"));
    }
}
