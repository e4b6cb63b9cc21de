//! A damaged data directory is refused, never served as a different state.
//!
//! Each test builds real data with the real server, damages a copy of it as
//! a disk, a backup script or an operator's `cp` would, and asks the real
//! binary: `deadbolt data check` (the very checks `deadbolt server` runs
//! before it opens anything for writing) and `deadbolt server` itself.

mod common;

use common::{deadbolt, log_segments, roll_back_log, TestServer, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

const DB: &str = "deadbolt.redb";
const SNAPSHOTS: &str = "deadbolt-snapshots.redb";
const PAGE: usize = 4096;

/// Locks taken in `server`, each in its own one-hour session, and a fenced
/// store key written with the last token. Returns the tokens.
fn take_locks(server: &TestServer, names: &[&str]) -> Vec<u64> {
    let endpoint = server.endpoint();
    let tokens: Vec<u64> = names
        .iter()
        .map(|name| {
            let out = deadbolt(&endpoint, &["acquire", "--lock", name, "--ttl", "1h"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8(out.stdout).unwrap();
            stdout.split_whitespace().last().unwrap().parse().unwrap()
        })
        .collect();
    let token = tokens.last().unwrap().to_string();
    let out = deadbolt(
        &endpoint,
        &["store", "put", "report", "v1", "--token", &token],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokens
}

/// What `deadbolt data check --json` says of `dir`: its exit code, its
/// report (or error) and its stderr.
fn check(dir: &Path) -> (i32, serde_json::Value, String) {
    let out = Command::new(BIN)
        .args(["data", "check", "--json", "--data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // A crash (a panic's 101, or a signal) is the one answer never allowed.
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("data check died of {:?}: {stderr}", out.status));
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON (exit {code}): {stderr}"));
    (code, json, stderr)
}

/// What `deadbolt data check` reports of `data` before any damage: the
/// state every damaged copy must read as, or be refused.
fn intact_report(data: &Path) -> serde_json::Value {
    let (code, intact, stderr) = check(data);
    assert_eq!(code, 0, "{stderr}");
    intact["report"].clone()
}

/// Starts `deadbolt server` on `dir` expecting a refusal; its stderr.
fn refused_start(dir: &Path) -> String {
    let out = Command::new(BIN)
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "server was not refused: {stderr}"
    );
    assert!(stderr.contains("refusing to start"), "{stderr}");
    stderr
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A stopped single node holding six locks and a store key.
fn stopped_node(root: &Path) -> (PathBuf, Vec<u64>) {
    let data = root.join("data");
    let mut server = TestServer::start(&data);
    let tokens = take_locks(&server, &["a", "b", "c", "d", "e", "f"]);
    assert!(server.terminate().success());
    (data, tokens)
}

/// How one damaged copy ended.
#[derive(Debug, Default)]
struct Sweep {
    same_state: usize,
    refused: usize,
}

/// Damages `file` in a copy of `data` with `damage` for each case, in
/// parallel, and requires each to read as exactly `intact` or be refused.
fn sweep(
    root: &Path,
    data: &Path,
    file: &str,
    intact: &serde_json::Value,
    cases: &[usize],
    damage: impl Fn(&mut Vec<u8>, usize) + Sync,
) -> Sweep {
    let original = std::fs::read(data.join(file)).unwrap();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let results: Vec<Sweep> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (original, damage) = (&original, &damage);
                scope.spawn(move || {
                    let copy = root.join(format!("sweep-{thread}"));
                    copy_dir(data, &copy);
                    let mut outcome = Sweep::default();
                    for &case in cases.iter().skip(thread).step_by(threads) {
                        let mut bytes = original.clone();
                        damage(&mut bytes, case);
                        std::fs::write(copy.join(file), &bytes).unwrap();
                        let (code, json, stderr) = check(&copy);
                        match code {
                            0 => {
                                assert_eq!(
                                    &json["report"], intact,
                                    "case {case}: a different state was served"
                                );
                                outcome.same_state += 1;
                            }
                            1 => {
                                assert_eq!(json["intact"], false, "case {case}");
                                assert!(
                                    stderr.contains("deadbolt data check:"),
                                    "case {case}: {stderr}"
                                );
                                // The refusal is all an operator reads, even
                                // when the storage library panicked on it.
                                assert!(!stderr.contains("panicked"), "case {case}: {stderr}");
                                outcome.refused += 1;
                            }
                            other => panic!("case {case}: exit {other}: {stderr}"),
                        }
                        // Nothing was written to the damaged file.
                        assert!(
                            std::fs::read(copy.join(file)).unwrap() == bytes,
                            "case {case}: the check wrote"
                        );
                    }
                    outcome
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results
        .into_iter()
        .fold(Sweep::default(), |all, one| Sweep {
            same_state: all.same_state + one.same_state,
            refused: all.refused + one.refused,
        })
}

/// Every page holding data, and every 8th of the never-written (all-zero)
/// rest of redb's preallocated file: enough to cover its free space without
/// a minute of CI per sweep.
fn pages_to_damage(bytes: &[u8]) -> Vec<usize> {
    (0..bytes.len().div_ceil(PAGE))
        .filter(|&page| {
            let chunk = &bytes[page * PAGE..((page + 1) * PAGE).min(bytes.len())];
            page % 8 == 0 || chunk.iter().any(|&b| b != 0)
        })
        .collect()
}

fn invert_page(bytes: &mut [u8], page: usize) {
    let end = ((page + 1) * PAGE).min(bytes.len());
    bytes[page * PAGE..end].iter_mut().for_each(|b| *b = !*b);
}

#[test]
fn every_inverted_page_reads_as_the_same_state_or_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (data, _) = stopped_node(root.path());
    let intact = intact_report(&data);
    assert_eq!(intact["locks"], 6);
    assert_eq!(intact["store_keys"], 1);

    let original = std::fs::read(data.join(DB)).unwrap();
    let pages = pages_to_damage(&original);
    let inverted = sweep(root.path(), &data, DB, &intact, &pages, |bytes, page| {
        invert_page(bytes, page)
    });
    eprintln!("{} pages inverted: {inverted:?}", pages.len());
    assert!(
        inverted.refused > 0,
        "no inverted page was noticed: {inverted:?}"
    );
}

#[test]
fn every_truncation_at_a_page_boundary_reads_as_the_same_state_or_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (data, _) = stopped_node(root.path());
    let intact = intact_report(&data);
    let original = std::fs::read(data.join(DB)).unwrap();
    let boundaries = pages_to_damage(&original);
    let truncated = sweep(
        root.path(),
        &data,
        DB,
        &intact,
        &boundaries,
        |bytes, page| {
            bytes.truncate(page * PAGE);
        },
    );
    eprintln!("{} truncations: {truncated:?}", boundaries.len());
    assert!(truncated.refused > 0);
}

/// The log's segment file (data format 12), whose records are each
/// written twice, in its two halves: every page holding records, and every
/// 64th of its zero-filled rest, inverted, which the intact copy makes
/// good; the same page inverted in both halves, which loses the records
/// there (refused: the witness says the log went further), or only the
/// zeros after them (a torn write's leftovers: nothing lost); and the file
/// cut at each of those pages.
#[test]
fn every_inverted_or_cut_page_of_the_log_segment_reads_as_the_same_state_or_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (data, _) = stopped_node(root.path());
    let intact = intact_report(&data);
    let segments = log_segments(&data);
    let [segment] = &segments[..] else {
        panic!("one log segment expected (the next is created when it is half full): {segments:?}");
    };
    let original = std::fs::read(data.join(segment)).unwrap();
    let half = original.len() / 2 / PAGE;
    let pages: Vec<usize> = (0..original.len() / PAGE)
        .filter(|&page| {
            page % 64 == 0
                || original[page * PAGE..(page + 1) * PAGE]
                    .iter()
                    .any(|&b| b != 0)
        })
        .collect();
    let inverted = sweep(
        root.path(),
        &data,
        segment,
        &intact,
        &pages,
        |bytes, page| invert_page(bytes, page),
    );
    assert_eq!(
        (inverted.same_state, inverted.refused),
        (pages.len(), 0),
        "one copy of every record is intact"
    );
    let first_half: Vec<usize> = pages.iter().copied().filter(|&page| page < half).collect();
    let both = sweep(
        root.path(),
        &data,
        segment,
        &intact,
        &first_half,
        |bytes, page| {
            invert_page(bytes, page);
            invert_page(bytes, half + page);
        },
    );
    let cut = sweep(
        root.path(),
        &data,
        segment,
        &intact,
        &pages,
        |bytes, page| bytes.truncate(page * PAGE),
    );
    eprintln!(
        "{} pages: inverted {inverted:?}, in both halves {both:?}, cut {cut:?}",
        pages.len()
    );
    // The records fill the first page of each half: losing both copies of
    // it, or cutting the file there, loses acknowledged grants.
    assert!(both.refused > 0 && cut.refused > 0, "{both:?} {cut:?}");
    assert!(
        both.same_state > 0 && cut.same_state > 0,
        "{both:?} {cut:?}"
    );
}

/// The snapshot file, its snapshot in chunks since data format 11 (so that
/// the file stays under four times the snapshot), swept as the log's is: a
/// node whose log was compacted behind its snapshot, so that the snapshot
/// is the only record of the compacted grants.
#[test]
fn every_inverted_page_of_the_snapshot_file_reads_as_the_same_state_or_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let mut server = TestServer::start_with(&data, addr, &["--snapshot-every", "10"]);
    take_locks(&server, &["a", "b", "c", "d", "e", "f"]);
    assert!(server.terminate().success());
    let intact = intact_report(&data);
    assert!(intact["purged"].as_u64() > Some(0), "{intact}");

    let original = std::fs::read(data.join(SNAPSHOTS)).unwrap();
    let pages = pages_to_damage(&original);
    let inverted = sweep(
        root.path(),
        &data,
        SNAPSHOTS,
        &intact,
        &pages,
        |bytes, page| invert_page(bytes, page),
    );
    eprintln!("{} pages inverted: {inverted:?}", pages.len());
    assert!(
        inverted.refused > 0,
        "no inverted page was noticed: {inverted:?}"
    );
}

/// The black-box run that found it: a file cut to 0 bytes or deleted made
/// the node start as a fresh cluster, tokens from 1.
#[test]
fn a_database_cut_to_nothing_or_deleted_is_refused_not_started_afresh() {
    let root = tempfile::tempdir().unwrap();
    let (data, _) = stopped_node(root.path());
    let witness_before = std::fs::read(data.join("deadbolt.witness")).unwrap();

    std::fs::write(data.join(DB), b"").unwrap();
    let stderr = refused_start(&data);
    assert!(stderr.contains("missing or empty"), "{stderr}");
    assert!(stderr.contains("rebuild it from its peers"), "{stderr}");
    assert_eq!(
        std::fs::metadata(data.join(DB)).unwrap().len(),
        0,
        "the refusal wrote"
    );

    std::fs::remove_file(data.join(DB)).unwrap();
    refused_start(&data);
    assert!(!data.join(DB).exists(), "the refusal created a database");
    assert_eq!(
        std::fs::read(data.join("deadbolt.witness")).unwrap(),
        witness_before
    );
}

/// A copy of the database and log from before the last grants (an old
/// `cp`) is intact, so only the witness can tell: the node must not serve
/// it and hand out those grants' tokens again.
#[test]
fn a_database_rolled_back_to_an_older_copy_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let mut server = TestServer::start(&data);
    take_locks(&server, &["a", "b"]);
    assert!(server.terminate().success());
    let older = root.path().join("older");
    copy_dir(&data, &older);
    let server = TestServer::start_on(&data, server.addr);
    let newer = take_locks(&server, &["c"]);
    drop(server);

    roll_back_log(&older, &data);
    let stderr = refused_start(&data);
    assert!(stderr.contains("went back to an older state"), "{stderr}");
    let (code, _, stderr) = check(&data);
    assert_eq!(code, 1, "{stderr}");

    // The documented way out for a single node: start afresh. Its locks are
    // gone, but no token goes back.
    std::fs::rename(&data, root.path().join("damaged")).unwrap();
    let fresh = TestServer::start(&data);
    let token = take_locks(&fresh, &["c"])[0];
    assert!(
        token > newer[0],
        "token {token} after a fresh start is not above {}",
        newer[0]
    );
}

/// The black-box run that found it: 16 bytes flipped at offset 100 (in
/// redb's header) aborted the server on an 8 TiB allocation after it had
/// already written to the file, or served it without an acknowledged write.
/// Offset 100 falls in one of redb's two commit slots, the newest or the one
/// before depending on how many commits the file has seen: damage to the
/// older one changes nothing, damage to the newest must be refused.
#[test]
fn sixteen_bytes_flipped_at_offset_100_read_as_the_same_state_or_are_refused_never_a_crash() {
    let root = tempfile::tempdir().unwrap();
    let (data, _) = stopped_node(root.path());
    let intact = intact_report(&data);
    let variants: Vec<usize> = (1..=16).collect();
    let outcome = sweep(
        root.path(),
        &data,
        DB,
        &intact,
        &variants,
        |bytes, variant| {
            for (k, byte) in bytes[100..116].iter_mut().enumerate() {
                *byte ^= ((k * 31 + variant * 17) % 255 + 1) as u8;
            }
        },
    );
    assert_eq!(
        outcome.same_state + outcome.refused,
        variants.len(),
        "{outcome:?}"
    );
}

/// A whole directory put back from a backup (database and witness agree)
/// starts with the backup's state, and the tokens it hands out are still
/// above every token issued since the backup was taken.
#[test]
fn a_node_restored_from_an_older_backup_never_reissues_a_token() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let mut server = TestServer::start(&data);
    take_locks(&server, &["a"]);
    assert!(server.terminate().success());
    let backup = root.path().join("backup");
    copy_dir(&data, &backup);
    let mut server = TestServer::start_on(&data, server.addr);
    let since_backup = take_locks(&server, &["b", "c", "d"]);
    assert!(server.terminate().success());

    std::fs::remove_dir_all(&data).unwrap();
    copy_dir(&backup, &data);
    let restored = TestServer::start_on(&data, server.addr);
    let status = |lock: &str| {
        let out = deadbolt(&restored.endpoint(), &["status", "--lock", lock]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(status("a").contains("held by session"), "{}", status("a"));
    assert_eq!(status("b"), "b: free\n", "the backup is older than lock b");
    let token = take_locks(&restored, &["b"])[0];
    let highest = *since_backup.iter().max().unwrap();
    assert!(
        token > highest,
        "restored node issued {token}, not above {highest}"
    );
}

/// The snapshot has a database of its own (so that writing a full table
/// never holds up the log's appends). Once the log was compacted behind it,
/// that file is the only record of the compacted grants: lost, or an older
/// copy, and the node would start without them and reissue their tokens.
#[test]
fn a_snapshot_file_lost_or_rolled_back_after_compaction_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let flags = ["--snapshot-every", "10"];
    let mut server = TestServer::start_with(&data, addr, &flags);
    take_locks(&server, &["a", "b", "c", "d"]);
    assert!(server.terminate().success());
    let older = root.path().join("older");
    copy_dir(&data, &older);
    let mut server = TestServer::start_with(&data, addr, &flags);
    let newer = take_locks(&server, &["e", "f", "g", "h", "i", "j", "k", "l", "m", "n"]);
    assert!(server.terminate().success());
    let (code, intact, _) = check(&data);
    assert_eq!(code, 0, "{intact}");
    let purged = intact["report"]["purged"]
        .as_u64()
        .expect("the log was compacted");
    assert!(purged > 0, "{intact}");

    let snapshots = data.join(SNAPSHOTS);
    let kept = std::fs::read(&snapshots).unwrap();
    std::fs::copy(older.join(SNAPSHOTS), &snapshots).unwrap();
    let stderr = refused_start(&data);
    assert!(stderr.contains(SNAPSHOTS), "{stderr}");
    assert!(stderr.contains("went back to an older state"), "{stderr}");
    let (code, _, stderr) = check(&data);
    assert_ne!(code, 0, "{stderr}");

    std::fs::remove_file(&snapshots).unwrap();
    let stderr = refused_start(&data);
    assert!(
        stderr.contains(&format!("compacted up to index {purged}")),
        "{stderr}"
    );
    assert!(!snapshots.exists(), "the refusal created a snapshot file");

    // Put back, the directory serves everything it held: no token reissued.
    std::fs::write(&snapshots, kept).unwrap();
    let server = TestServer::start_with(&data, addr, &flags);
    let after = take_locks(&server, &["o"]);
    assert!(after[0] > *newer.iter().max().unwrap());
}
