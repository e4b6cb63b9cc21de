//! Session secrets: what makes a session a capability rather than a number.
//!
//! `status`, `locks` and `history` show every holder's session id and token
//! to anyone who asks (they are how people find out who holds what). Were
//! the id enough to act on a session, anyone could release, keep alive or
//! close somebody else's: `curl /v1/lock/status`, then a release with what it
//! showed, freed the lock of a running `deadbolt run`. So, like the random
//! owner value a Redis lock is set with, every session gets a secret when it
//! opens: the server draws it, returns it once to the client that opened the
//! session, and refuses every call on the session that does not carry it.
//!
//! The replicated table keeps only the secret's SHA-256 ([`SecretHash`]): the
//! log, snapshots and other replicas never see the secret, yet every replica
//! can check it, and keeps checking it after a leader change or a restart.
//! The check compares hashes in constant time, so how long a refusal takes
//! tells nothing about how close a guess was. It runs in the server rather
//! than in `deadbolt-core`, which stays free of randomness and cryptography.
//!
//! The cluster secret that peers show each other without TLS
//! (`auth/peers.rs`) is drawn here too, and checked with [`matches`].
//!
//! Secrets come from the operating system's CSPRNG, except in the
//! deterministic simulation, which seeds them so that a seed replays exactly.

use deadbolt_core::SecretHash;
use rand::rngs::{OsRng, StdRng};
use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};
use subtle::ConstantTimeEq;

/// Random bytes in a secret: 128 bits, beyond guessing (each guess is a
/// request), and 32 hex digits on the wire.
const SECRET_BYTES: usize = 16;

/// Where a node's session secrets come from.
#[derive(Clone, Debug)]
pub struct SecretSource {
    /// `None`: the operating system's CSPRNG.
    seeded: Option<Arc<Mutex<StdRng>>>,
}

impl SecretSource {
    /// The operating system's CSPRNG: what every real server uses.
    pub fn os() -> Self {
        SecretSource { seeded: None }
    }

    /// Secrets that follow from `seed`, for the deterministic simulation
    /// only: anyone who knows the seed knows every secret.
    pub fn seeded(seed: u64) -> Self {
        SecretSource {
            seeded: Some(Arc::new(Mutex::new(StdRng::seed_from_u64(seed)))),
        }
    }

    /// A new secret (hex digits, for the client) and its hash (for the
    /// table).
    pub(crate) fn draw(&self) -> (String, SecretHash) {
        let mut bytes = [0; SECRET_BYTES];
        match &self.seeded {
            None => OsRng.fill_bytes(&mut bytes),
            Some(rng) => rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .fill_bytes(&mut bytes),
        }
        let secret = hex(&bytes);
        let hash = hash(&secret);
        (secret, hash)
    }
}

/// Random bytes in a cluster secret (`deadbolt peer-secret new`): 256
/// bits. It is checked on every peer call for as long as the cluster runs,
/// so it gets twice a session secret's margin.
const PEER_SECRET_BYTES: usize = 32;

/// A new cluster secret from the operating system's CSPRNG, as hex digits.
pub fn new_peer_secret() -> String {
    let mut bytes = [0; PEER_SECRET_BYTES];
    OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}

/// Lowercase hex digits, two per byte.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The hash the table keeps of `secret`: SHA-256 of the secret as the client
/// sends it (the hex text), so the server never has to parse it.
pub(crate) fn hash(secret: &str) -> SecretHash {
    SecretHash(Sha256::digest(secret.as_bytes()).into())
}

/// Whether `presented` is the secret that `expected` is the hash of, in
/// time that does not depend on where the hashes differ.
pub(crate) fn matches(presented: &str, expected: &SecretHash) -> bool {
    hash(presented).0.ct_eq(&expected.0).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drawn_secret_matches_its_hash_and_nothing_else() {
        let source = SecretSource::os();
        let (secret, hash) = source.draw();
        assert_eq!(secret.len(), 2 * SECRET_BYTES);
        assert!(secret
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(matches(&secret, &hash));
        assert!(!matches("", &hash));
        assert!(!matches(&secret.to_uppercase(), &hash));
        assert!(!matches(&secret[1..], &hash));
        assert!(!matches(&format!("{secret}0"), &hash));
        let mut flipped = secret.clone().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        assert!(!matches(&String::from_utf8(flipped).unwrap(), &hash));
    }

    #[test]
    fn every_secret_is_new() {
        let source = SecretSource::os();
        let drawn: std::collections::HashSet<String> = (0..1000).map(|_| source.draw().0).collect();
        assert_eq!(drawn.len(), 1000);
    }

    #[test]
    fn a_seed_gives_the_same_secrets_and_another_seed_others() {
        let draw = |seed| {
            let source = SecretSource::seeded(seed);
            (0..3).map(|_| source.draw().0).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn the_hash_is_sha256_of_the_text_as_sent() {
        // FIPS 180-2, appendix B.1: SHA-256("abc").
        let expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hex(&hash("abc").0), expected);
    }
}
