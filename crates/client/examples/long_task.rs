//! Holds a lock for a task longer than the lease: the session's watchdog
//! renews it, and the task stops, with a margin to spare, if renewal fails.
//! Try stopping the server (ctrl-c) while it runs.
//!
//! ```sh
//! cargo run -p deadbolt-client --example long_task
//! ```

use deadbolt_client::Client;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), deadbolt_client::Error> {
    let client = Client::connect(["http://127.0.0.1:7070"]).await?;
    // A short lease, renewed every ~2 s, for a 20 s task.
    let session = client.open_session(Duration::from_secs(6)).await?;
    let guard = session.lock("search-index").await?;
    println!("rebuilding with token {}", guard.token());
    let work = async {
        for step in 1..=20 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("step {step}/20");
        }
    };
    tokio::select! {
        () = work => {
            guard.release().await?;
            println!("finished and released");
        }
        reason = session.lost(Duration::from_secs(2)) => {
            println!("stopped early: {reason}");
        }
    }
    Ok(())
}
