//! The full-disk fault (issue 31 §3): one node's data directory stops
//! taking writes while the node runs, and takes them again later.
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

    /// Restarts `victim` with the library, fills its disk after a moment,
    /// and after one to four seconds frees it again and starts the node as
    /// usual. A node that stopped without saying why is a violation.
    /// Returns what happened.
    pub async fn inject(
        &self,
        cluster: &mut TestCluster,
        victim: u64,
        role: &str,
        rng: &mut StdRng,
        violations: &mut Vec<Violation>,
    ) -> String {
        // Only what the node says from now on counts: an earlier fault's
        // words are in the same log.
        let said_before = cluster.node(victim).log_text().len();
        let library = self.library.display().to_string();
        let trigger = self.trigger.display().to_string();
        cluster.kill9(victim);
        cluster.start_node_with_env(
            victim,
            &[("LD_PRELOAD", &library), ("FULLDISK_TRIGGER", &trigger)],
        );
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
        // With the slash: the node's log file sits next to its data
        // directory, with the same name and `.log`.
        let data_dir = format!("{}/", cluster.node(victim).data_dir.display());
        std::fs::write(&self.trigger, &data_dir).expect("write the full-disk trigger");
        let full_for = Duration::from_millis(rng.gen_range(1000..4000));
        tokio::time::sleep(full_for).await;
        let stopped = cluster.exited(victim);
        std::fs::remove_file(&self.trigger).expect("remove the full-disk trigger");
        let outcome = match stopped {
            Some(status) => {
                let whole = cluster.node(victim).log_text();
                let log = whole.get(said_before..).unwrap_or_default();
                let said = log
                    .lines()
                    .find(|line| line.contains(ENOSPC))
                    .map(str::to_owned);
                match said {
                    Some(line) => format!("it stopped ({status}), saying: {}", last_words(&line)),
                    None => {
                        violations.push(Violation {
                            what: format!(
                                "node {victim} stopped on a full disk ({status}) without saying \
                                 so: no line names it"
                            ),
                            records: log.lines().rev().take(5).map(str::to_owned).collect(),
                        });
                        format!("it stopped ({status}) WITHOUT SAYING WHY")
                    }
                }
            }
            None => {
                cluster.kill9(victim);
                "it was still running (killed)".to_owned()
            }
        };
        cluster.start_node(victim);
        format!(
            "full disk: node {victim}{role} for {full_for:?}; {outcome}; restarted with space back"
        )
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
