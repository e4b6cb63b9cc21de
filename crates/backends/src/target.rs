//! [`Target`]: which lock service a URL names, checked before anything
//! connects, so that a typo is a clear refusal and not a hang or a lock taken
//! on the wrong system.
//!
//! One URL per backend, its scheme choosing it:
//!
//! - `http://HOST:PORT[,…]`, `https://…`: the Deadbolt server (its endpoints);
//! - `redis://HOST:PORT[/DB][?fence=counter]`: one Redis server;
//! - `redlock://HOST:PORT,HOST:PORT,HOST:PORT[,…]`: Redlock over independent
//!   Redis masters;
//! - `etcd://HOST:PORT[,…]`: an etcd cluster's client endpoints;
//! - `postgres://…` or `postgresql://…`: a PostgreSQL database, in
//!   libpq's URL form (plus `idle_session_timeout=off`, unsafe, to measure
//!   what the hung-holder protection prevents).

use crate::Error;

/// The most servers one URL may list: a Deadbolt, etcd or Redlock
/// deployment is 3 to 7 nodes; more is a mistake (say, a pasted host list).
pub const MAX_NODES: usize = 15;

/// Redlock needs a majority of independent masters: with fewer than 3 one
/// failure loses it, and there is nothing to gain over one server.
pub const MIN_REDLOCK_NODES: usize = 3;

/// A parsed lock URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The Deadbolt server, through `deadbolt-client`.
    Deadbolt { endpoints: Vec<String> },
    /// One Redis server; with `fence`, an `INCR`ed counter beside each lock.
    Redis { node: String, fence: bool },
    /// Redlock over these independent Redis masters.
    Redlock { nodes: Vec<String> },
    /// etcd's client endpoints, as `http://HOST:PORT`.
    Etcd { endpoints: Vec<String> },
    /// A PostgreSQL connection URL (libpq's form, without our option).
    /// `idle_timeout: false` (`?idle_session_timeout=off`) leaves
    /// PostgreSQL's `idle_session_timeout` unset: a holder hung with its
    /// socket open then keeps its locks forever. Unsafe; it exists to
    /// measure what the timeout prevents (docs/backends.md).
    Postgres { url: String, idle_timeout: bool },
}

const SCHEMES: &str = "http(s)://, redis://, redlock://, etcd://, postgres://";

impl Target {
    pub fn parse(url: &str) -> Result<Target, Error> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(Error::invalid(format!(
                "{url:?} is not a lock URL: it has no scheme (want one of {SCHEMES})"
            )));
        };
        let refuse = |why: String| Error::invalid(format!("lock URL {url:?}: {why}"));
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
            "redis" => {
                let (address, fence) = match rest.split_once('?') {
                    None => (rest, false),
                    Some((address, "fence=counter")) => (address, true),
                    Some((_, query)) => {
                        return Err(refuse(format!(
                            "unknown option {query:?} (the only one is ?fence=counter)"
                        )))
                    }
                };
                let (host, db) = address.split_once('/').unwrap_or((address, ""));
                if !db.is_empty() && db.parse::<u8>().is_err() {
                    return Err(refuse(format!("database {db:?} is not a number")));
                }
                let hosts = hosts(host).map_err(refuse)?;
                if hosts.len() > 1 {
                    return Err(refuse(
                        "redis:// takes one server; for several independent masters use \
                         redlock://HOST:PORT,HOST:PORT,HOST:PORT"
                            .into(),
                    ));
                }
                Ok(Target::Redis {
                    node: format!("redis://{address}"),
                    fence,
                })
            }
            "redlock" => {
                let nodes = hosts(rest).map_err(refuse)?;
                if nodes.len() < MIN_REDLOCK_NODES {
                    return Err(refuse(format!(
                        "Redlock needs at least {MIN_REDLOCK_NODES} independent Redis masters \
                         (got {}); for one server use redis://HOST:PORT",
                        nodes.len()
                    )));
                }
                Ok(Target::Redlock {
                    nodes: nodes
                        .into_iter()
                        .map(|host| format!("redis://{host}"))
                        .collect(),
                })
            }
            "etcd" => {
                let endpoints = hosts(rest).map_err(refuse)?;
                Ok(Target::Etcd {
                    endpoints: endpoints
                        .into_iter()
                        .map(|host| format!("http://{host}"))
                        .collect(),
                })
            }
            "postgres" | "postgresql" => {
                let (url, idle_timeout) = match take_param(url, IDLE_TIMEOUT_OFF) {
                    Some(rest) => (rest, false),
                    None => (url.to_owned(), true),
                };
                url.parse::<tokio_postgres::Config>()
                    .map_err(|err| refuse(err.to_string()))?;
                Ok(Target::Postgres { url, idle_timeout })
            }
            other => Err(Error::invalid(format!(
                "lock URL {url:?}: unknown scheme {other:?} (want one of {SCHEMES})"
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

/// A comma-separated list of `HOST:PORT`, at most [`MAX_NODES`] of them,
/// none repeated.
fn hosts(list: &str) -> Result<Vec<String>, String> {
    let list = list.trim_end_matches('/');
    let hosts: Vec<String> = list.split(',').map(str::to_owned).collect();
    for host in &hosts {
        let Some((name, port)) = host.rsplit_once(':') else {
            return Err(format!("{host:?} has no port (want HOST:PORT)"));
        };
        if name.is_empty() || name.contains('/') || name.contains('@') {
            return Err(format!("{host:?} is not HOST:PORT"));
        }
        if port.parse::<u16>().map_or(true, |port| port == 0) {
            return Err(format!(
                "{host:?}: port {port:?} is not a number in 1..65535"
            ));
        }
    }
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
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

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
                node: "redis://127.0.0.1:6379/2".into(),
                fence: true
            }
        );
        assert_eq!(
            Target::parse("redlock://a:1,b:1,c:1").unwrap(),
            Target::Redlock {
                nodes: vec![
                    "redis://a:1".into(),
                    "redis://b:1".into(),
                    "redis://c:1".into()
                ]
            }
        );
        assert_eq!(
            Target::parse("etcd://e:2379").unwrap(),
            Target::Etcd {
                endpoints: vec!["http://e:2379".into()]
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
                idle_timeout: false
            }
        );
    }

    #[test]
    fn refusals_name_the_problem_and_the_fix() {
        for (url, says) in [
            ("localhost:6379", "no scheme"),
            ("mysql://h:1", "unknown scheme \"mysql\""),
            ("redis://h", "has no port"),
            ("redis://h:99999", "not a number in 1..65535"),
            ("redis://h:1?fence=yes", "the only one is ?fence=counter"),
            ("redis://a:1,b:2", "use redlock://"),
            (
                "redlock://a:1,b:2",
                "at least 3 independent Redis masters (got 2)",
            ),
            ("redlock://a:1,a:1,b:2", "listed twice"),
            ("etcd://", "has no port"),
            ("postgres://h:notaport/db", "lock URL"),
        ] {
            let message = refusal(url);
            assert!(message.contains(says), "{url}: {message}");
        }
        let many = (1..=16).map(|i| format!("h{i}:1")).collect::<Vec<_>>();
        assert!(refusal(&format!("etcd://{}", many.join(","))).contains("at most 15"));
    }
}
