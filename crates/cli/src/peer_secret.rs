//! `deadbolt peer-secret`: the cluster secret a plain-text cluster's nodes
//! authenticate each other with (the server's `auth/peers.rs` says why a
//! secret, and what it protects).
//!
//! Offline, as `deadbolt certs` is: it writes a file, mode 0600, that the
//! operator copies to every node and gives with `--peer-secret-file`.
//! Rotation without downtime is three rounds over the nodes, each ended by
//! a SIGHUP (docs/security.md, "Peers"): `add` a new secret at the end
//! (every node accepts it), move it to the first line (every node sends
//! it), delete the old line.

use crate::exit;
use anyhow::Context;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(clap::Subcommand)]
pub enum PeerSecretCommand {
    /// Write a new secret file (mode 0600); an existing file is kept.
    New {
        /// The file to create; give the same file to every node.
        file: PathBuf,
    },
    /// Add a newly drawn secret as the file's last line, to rotate: every
    /// node accepts it once given the file (SIGHUP), and sends it once it
    /// is moved to the first line.
    Add {
        /// A secret file made by `deadbolt peer-secret new`.
        file: PathBuf,
    },
}

pub fn main(command: PeerSecretCommand) -> i32 {
    let done = match &command {
        PeerSecretCommand::New { file } => create(file),
        PeerSecretCommand::Add { file } => add(file),
    };
    match done {
        Ok(message) => {
            println!("{message}");
            exit::OK
        }
        Err(err) => {
            eprintln!("deadbolt peer-secret: {err:#}");
            exit::FAILURE
        }
    }
}

fn create(file: &Path) -> anyhow::Result<String> {
    let text = format!(
        "# Deadbolt cluster secret: the first line is sent, every line accepted.\n{}\n",
        deadbolt_server::new_peer_secret()
    );
    crate::certs::write_new(file, &text, 0o600)?;
    Ok(format!(
        "wrote {}: copy it to every node (mode 0600) and start each with --peer-secret-file",
        file.display()
    ))
}

fn add(file: &Path) -> anyhow::Result<String> {
    let shown = file.display();
    let old = std::fs::read_to_string(file).with_context(|| format!("cannot read {shown}"))?;
    let mut text = old.clone();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&deadbolt_server::new_peer_secret());
    text.push('\n');
    // Beside it, then renamed over it: a crash leaves the old file or the
    // new one, never half of one.
    let fresh = file.with_extension("new");
    let _ = std::fs::remove_file(&fresh);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&fresh)
        .with_context(|| format!("cannot create {}", fresh.display()))?;
    out.write_all(text.as_bytes())
        .and_then(|()| out.sync_all())
        .with_context(|| format!("cannot write {}", fresh.display()))?;
    std::fs::rename(&fresh, file).with_context(|| format!("cannot replace {shown}"))?;
    Ok(format!(
        "added a secret as the last line of {shown}: copy it to every node and send each a \
         SIGHUP; then move the new line to the top, copy and SIGHUP again; then delete the old \
         line, copy and SIGHUP"
    ))
}
