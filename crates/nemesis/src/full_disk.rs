//! The full-disk fault (issue 31 §3, issue 58 §2): one node's data
//! directory, or every node's, stops taking writes while the nodes run, and
//! takes them again later.
//!
//! Why a fault of its own: a full disk is the storage failure operators
//! meet most, and the one a server is most tempted to paper over (retry,
//! skip, answer anyway). The node must not acknowledge what it could not
//! write, must say in words an operator acts on why it refuses writes, must
//! not stop (a full disk is an error, not an outage), and must serve again
//! by itself once space is back. The history checkers say whether anything
//! acknowledged was lost, and the availability checker whether callers
//! noticed; this module checks the words and that the node lived through it.
//!
//! The disk is real; testkit's `fulldisk` library (`LD_PRELOAD`) fails the
//! node's writes under its data directory with ENOSPC while a trigger file
//! exists, so the disk fills at a moment the run chooses, mid-write.

use crate::checker::Violation;
use deadbolt_testkit::TestCluster;
use rand::rngs::StdRng;
use rand::Rng;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the kernel says on a full disk, as Rust prints it: the node's log
/// must carry it when it refuses writes for want of space.
const ENOSPC: &str = "No space left on device";
/// What a node says once space is back and its writes go through.
const SPACE_BACK: &str = "space is back";
/// How long a node may take to resume once space is back: its waits
/// between tries are 0.2 s at most, so this is all slack for a loaded
/// machine.
const RESUME_WAIT: Duration = Duration::from_secs(10);

pub struct FullDisk {
    library: PathBuf,
    trigger: PathBuf,
}

impl FullDisk {
    /// Builds the library into `dir`, where the trigger file lives too.
    pub fn new(dir: &Path) -> FullDisk {
        FullDisk {
            library: deadbolt_testkit::fulldisk_library(dir),
            trigger: dir.join("disk-full"),
        }
    }

    /// Restarts `victims` with the library, fills their disks after a
    /// moment, and after one to four seconds frees them again. A node that
    /// stopped, said nothing of the disk, or did not resume by itself is a
    /// violation. The victims run on, with the library and no trigger.
    /// Returns what happened.
    pub async fn inject(
        &self,
        cluster: &mut TestCluster,
        (victims, label): (&[u64], &str),
        rng: &mut StdRng,
        violations: &mut Vec<Violation>,
    ) -> String {
        let library = self.library.display().to_string();
        let trigger = self.trigger.display().to_string();
        // Only what a node says from now on counts: an earlier fault's
        // words are in the same log.
        let mut said_before = Vec::new();
        for &victim in victims {
            said_before.push(cluster.node(victim).log_text().len());
            cluster.kill9(victim);
            cluster.start_node_with_env(
                victim,
                &[("LD_PRELOAD", &library), ("FULLDISK_TRIGGER", &trigger)],
            );
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
        // With the slash: a node's log file sits next to its data
        // directory, with the same name and `.log`.
        let data_dirs: String = victims
            .iter()
            .map(|victim| format!("{}/\n", cluster.node(*victim).data_dir.display()))
            .collect();
        std::fs::write(&self.trigger, data_dirs).expect("write the full-disk trigger");
        let full_for = Duration::from_millis(rng.gen_range(1000..4000));
        tokio::time::sleep(full_for).await;
        let refused: Vec<bool> = victims
            .iter()
            .zip(&said_before)
            .map(|(&victim, &said_before)| Self::refused(cluster, victim, said_before, violations))
            .collect();
        std::fs::remove_file(&self.trigger).expect("remove the full-disk trigger");
        let mut outcomes = Vec::new();
        for ((&victim, said_before), refused) in victims.iter().zip(said_before).zip(refused) {
            let outcome = if refused {
                Self::resumed(cluster, victim, said_before, violations).await
            } else {
                "took no write while full".to_owned()
            };
            outcomes.push(format!("node {victim} {outcome}"));
        }
        format!(
            "full disk on {label} for {full_for:?}: {}; space back",
            outcomes.join(", ")
        )
    }

    /// Whether `victim` refused a write for want of space, saying so; one
    /// that stopped is a violation (and is started again, without the
    /// library).
    fn refused(
        cluster: &mut TestCluster,
        victim: u64,
        said_before: usize,
        violations: &mut Vec<Violation>,
    ) -> bool {
        let whole = cluster.node(victim).log_text();
        let log = whole.get(said_before..).unwrap_or_default();
        if let Some(status) = cluster.exited(victim) {
            violations.push(Violation {
                what: format!(
                    "node {victim} stopped on a full disk ({status}): a full disk must be an \
                     error, not an outage"
                ),
                records: log.lines().rev().take(5).map(str::to_owned).collect(),
            });
            cluster.start_node(victim);
            return false;
        }
        log.lines().any(|line| line.contains(ENOSPC))
    }

    /// Waits for `victim` to say its writes go through again; one that
    /// does not within [`RESUME_WAIT`], or stops, is a violation.
    async fn resumed(
        cluster: &mut TestCluster,
        victim: u64,
        said_before: usize,
        violations: &mut Vec<Violation>,
    ) -> String {
        let deadline = tokio::time::Instant::now() + RESUME_WAIT;
        loop {
            let whole = cluster.node(victim).log_text();
            let log = whole.get(said_before..).unwrap_or_default();
            if let Some(status) = cluster.exited(victim) {
                violations.push(Violation {
                    what: format!("node {victim} stopped ({status}) as space came back"),
                    records: log.lines().rev().take(5).map(str::to_owned).collect(),
                });
                cluster.start_node(victim);
                return format!("STOPPED ({status})");
            }
            if log.contains(SPACE_BACK) {
                let said = log
                    .lines()
                    .find(|line| line.contains(ENOSPC))
                    .map(what_waited)
                    .unwrap_or_default();
                return format!("refused writes, saying: {said}; resumed by itself");
            }
            if tokio::time::Instant::now() >= deadline {
                violations.push(Violation {
                    what: format!(
                        "node {victim} did not resume within {RESUME_WAIT:?} of space coming back"
                    ),
                    records: log.lines().rev().take(5).map(str::to_owned).collect(),
                });
                return "DID NOT RESUME".to_owned();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What a node's full-disk line says waited ("the disk is full: a log
/// append waits for space"), for the run's report.
fn what_waited(line: &str) -> &str {
    let said = line.find("the disk is full").map_or(line, |at| &line[at..]);
    said.split(';').next().unwrap_or(said)
}
