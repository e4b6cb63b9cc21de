//! The seeds' scenario in one process: two clients, one lock, and a resource
//! that refuses writes with a token lower than the highest it has accepted.
//! A holder whose lease ran out while it was "paused" is refused.
//!
//! ```sh
//! cargo run -p deadbolt-client --example fenced_write
//! ```

use deadbolt_client::Client;
use std::sync::Mutex;
use std::time::Duration;

/// The protected resource: it remembers the highest token it accepted.
#[derive(Default)]
struct Storage {
    fence: Mutex<(u64, String)>,
}

impl Storage {
    fn write(&self, token: u64, data: &str) -> Result<(), String> {
        let mut state = self.fence.lock().unwrap();
        if token < state.0 {
            return Err(format!("stale token {token}: already accepted {}", state.0));
        }
        *state = (token, data.to_owned());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let storage = Storage::default();
    let client = Client::connect(["http://127.0.0.1:7070"]).await?;

    // A takes the lock, then stops renewing: its raw session is never kept
    // alive, as if the process were paused by a long GC.
    let (paused, _) = client.open_session_raw(Duration::from_secs(1)).await?;
    let token_a = client
        .acquire_raw(&paused, "invoice-981", false, None)
        .await?;
    println!("A holds the lock with token {token_a}, then pauses");

    // B waits; the lock passes to B when A's lease runs out.
    let session_b = client.open_session(Duration::from_secs(10)).await?;
    let guard_b = session_b.lock("invoice-981").await?;
    println!(
        "A's lease expired; B holds the lock with token {}",
        guard_b.token()
    );
    storage.write(guard_b.token(), "written by B")?;

    // A wakes up, still believing it holds the lock, and writes.
    match storage.write(token_a, "written by A") {
        Ok(()) => println!("A's late write was accepted: the data is corrupt"),
        Err(refusal) => println!("A's late write was refused: {refusal}"),
    }
    guard_b.release().await?;
    session_b.close().await?;
    Ok(())
}
