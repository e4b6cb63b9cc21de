//! The full-disk fault (issue 31 §3): one node's data directory, or every
//! node's, stops taking writes while the nodes run, and takes them again
//! later.
//!
//! Why a fault of its own: a full disk is the storage failure operators
//! meet most, and the one a server is most tempted to paper over (retry,
//! skip, answer anyway). The node must not acknowledge what it could not
//! write, must say in words an operator acts on why it stopped, and must
//! serve again once space is back. The history checkers say whether
//! anything acknowledged was lost; this module checks the words.
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
/// must carry it (its last words then say to check the disk).
const ENOSPC: &str = "No space left on device";

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
    /// moment, and after one to four seconds frees them again and starts
    /// the nodes as usual. A node that stopped without saying why is a
    /// violation. Returns what happened.
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
        let outcomes: Vec<String> = victims
            .iter()
            .zip(said_before)
            .map(|(&victim, said_before)| {
                let outcome = Self::outcome(cluster, victim, said_before, violations);
                format!("node {victim} {outcome}")
            })
            .collect();
        std::fs::remove_file(&self.trigger).expect("remove the full-disk trigger");
        for &victim in victims {
            cluster.start_node(victim);
        }
        format!(
            "full disk on {label} for {full_for:?}: {}; restarted with space back",
            outcomes.join(", ")
        )
    }

    /// Whether `victim` stopped, and with what words; a node that still
    /// runs is killed, to start again without the library.
    fn outcome(
        cluster: &mut TestCluster,
        victim: u64,
        said_before: usize,
        violations: &mut Vec<Violation>,
    ) -> String {
        let Some(status) = cluster.exited(victim) else {
            cluster.kill9(victim);
            return "was still running (killed)".to_owned();
        };
        let whole = cluster.node(victim).log_text();
        let log = whole.get(said_before..).unwrap_or_default();
        match log.lines().find(|line| line.contains(ENOSPC)) {
            Some(line) => format!("stopped ({status}), saying: {}", last_words(line)),
            None => {
                violations.push(Violation {
                    what: format!(
                        "node {victim} stopped on a full disk ({status}) without saying so: no \
                         line names it"
                    ),
                    records: log.lines().rev().take(5).map(str::to_owned).collect(),
                });
                format!("stopped ({status}) WITHOUT SAYING WHY")
            }
        }
    }
}

/// The end of a long log line, for the run's report.
fn last_words(line: &str) -> &str {
    const KEEP: usize = 160;
    let start = line.len().saturating_sub(KEEP);
    let start = (start..line.len())
        .find(|i| line.is_char_boundary(*i))
        .unwrap_or(0);
    &line[start..]
}
