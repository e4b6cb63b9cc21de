//! `deadbolt certs`: a CA, and node and client certificates signed by it,
//! for a test or a small deployment, so that going from nothing to a TLS
//! cluster takes a few commands (like `cockroach cert create-*`).
//!
//! Generated with rcgen (ECDSA P-256), written as PEM beside each other in
//! one directory: `ca.pem`/`ca-key.pem`, `NAME.pem`/`NAME-key.pem`. Keys are
//! written mode 0600 and nothing is ever overwritten. An existing PKI works
//! just as well: the server takes any PEM certificate and key.

use crate::exit;
use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum CertsCommand {
    /// Create a CA (ca.pem, ca-key.pem) in --dir.
    Ca {
        #[command(flatten)]
        common: Common,
    },
    /// Create a node's certificate, signed by the CA in --dir: a server
    /// certificate for its --host names and addresses, also good as its
    /// client certificate towards its peers.
    Node {
        #[command(flatten)]
        common: Common,
        /// The file name, and the certificate's common name (e.g. node1).
        #[arg(long)]
        name: String,
        /// A DNS name or IP address clients and peers reach the node by;
        /// repeat for several. Defaults to localhost and 127.0.0.1.
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// Create a client certificate, signed by the CA in --dir; its common
    /// name is the client's identity.
    Client {
        #[command(flatten)]
        common: Common,
        /// The file name, and the certificate's common name (e.g. billing).
        #[arg(long)]
        name: String,
    },
}

#[derive(clap::Args)]
pub struct Common {
    /// Where the CA lives and the new files go.
    #[arg(long, default_value = "./deadbolt-certs")]
    dir: PathBuf,
    /// How long the certificate is valid (CA: ten times this).
    #[arg(long, default_value = "365days", value_parser = crate::parse_duration)]
    valid_for: Duration,
}

pub fn main(command: CertsCommand) -> i32 {
    match run(command) {
        Ok(written) => {
            for path in written {
                println!("wrote {}", path.display());
            }
            exit::OK
        }
        Err(err) => {
            eprintln!("deadbolt certs: {err:#}");
            exit::FAILURE
        }
    }
}

fn run(command: CertsCommand) -> anyhow::Result<Vec<PathBuf>> {
    match command {
        CertsCommand::Ca { common } => {
            std::fs::create_dir_all(&common.dir)
                .with_context(|| format!("cannot create {}", common.dir.display()))?;
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::default();
            // Named apart from other Deadbolt CAs: clients that meet a
            // certificate from another one then say "unknown issuer"
            // rather than fail on a signature under the same issuer name.
            let created = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
            params
                .distinguished_name
                .push(DnType::CommonName, format!("Deadbolt CA {created}"));
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            validity(&mut params, common.valid_for * 10);
            let cert = params.self_signed(&key)?;
            write_pair(&common.dir, "ca", &cert.pem(), &key.serialize_pem())
        }
        CertsCommand::Node {
            common,
            name,
            hosts,
        } => {
            let hosts = if hosts.is_empty() {
                vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
            } else {
                hosts
            };
            let sans = hosts
                .iter()
                .map(|host| match host.parse::<std::net::IpAddr>() {
                    Ok(ip) => Ok(SanType::IpAddress(ip)),
                    Err(_) => Ok(SanType::DnsName(host.clone().try_into().with_context(
                        || format!("--host {host:?} is neither an IP address nor a DNS name"),
                    )?)),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            issue(
                &common,
                &name,
                sans,
                &[
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            )
        }
        CertsCommand::Client { common, name } => issue(
            &common,
            &name,
            Vec::new(),
            &[ExtendedKeyUsagePurpose::ClientAuth],
        ),
    }
}

/// A certificate for `name`, signed by the CA in `common.dir`.
fn issue(
    common: &Common,
    name: &str,
    sans: Vec<SanType>,
    usages: &[ExtendedKeyUsagePurpose],
) -> anyhow::Result<Vec<PathBuf>> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!("--name {name:?}: use letters, digits, '-', '_' and '.' (it names the files)");
    }
    let read = |file: &str| {
        let path = common.dir.join(file);
        std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (create a CA first: deadbolt certs ca --dir {})",
                path.display(),
                common.dir.display()
            )
        })
    };
    let ca_key = KeyPair::from_pem(&read("ca-key.pem")?).context("ca-key.pem is not a key")?;
    let ca = CertificateParams::from_ca_cert_pem(&read("ca.pem")?)
        .context("ca.pem is not a CA certificate")?
        .self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.subject_alt_names = sans;
    params.extended_key_usages = usages.to_vec();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    validity(&mut params, common.valid_for);
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    write_pair(&common.dir, name, &cert.pem(), &key.serialize_pem())
}

fn validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = time::OffsetDateTime::now_utc();
    // A little slack for clocks slightly behind the one that issued it.
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + valid_for;
}

/// Writes `NAME.pem` and `NAME-key.pem` (0600), refusing to overwrite.
fn write_pair(dir: &Path, name: &str, cert: &str, key: &str) -> anyhow::Result<Vec<PathBuf>> {
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    for path in [&cert_path, &key_path] {
        if path.exists() {
            bail!(
                "{} exists already: nothing was written (move it aside to make a new one)",
                path.display()
            );
        }
    }
    write_new(&key_path, key, 0o600)?;
    write_new(&cert_path, cert, 0o644)?;
    Ok(vec![cert_path, key_path])
}

pub(crate) fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
