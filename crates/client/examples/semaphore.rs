//! A pool of three render slots shared by five workers: each takes a permit
//! of the semaphore `render-slots`, renders on the slot it was given, and
//! writes through that slot's fence. At most three render at once, and a
//! slot only ever sees tokens grow, as a lock's resource does.
//!
//! ```sh
//! cargo run -p deadbolt-client --example semaphore
//! ```

use deadbolt_client::Client;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SLOTS: u32 = 3;

/// The protected resource: one fence per slot, the highest token each
/// slot accepted.
#[derive(Default)]
struct Slots {
    fences: Mutex<HashMap<u32, u64>>,
}

impl Slots {
    fn write(&self, slot: u32, token: u64) -> Result<(), String> {
        let mut fences = self.fences.lock().unwrap();
        let fence = fences.entry(slot).or_default();
        if token < *fence {
            return Err(format!("slot {slot}: stale token {token} < {fence}"));
        }
        *fence = token;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(["http://127.0.0.1:7070"]).await?;
    let slots = Arc::new(Slots::default());
    let workers = (0..5).map(|worker| {
        let (client, slots) = (client.clone(), slots.clone());
        tokio::spawn(async move {
            let session = client.open_session(Duration::from_secs(10)).await?;
            // Every worker names the same capacity; each asks for one permit.
            let guard = session.acquire_permits("render-slots", SLOTS, 1).await?;
            let permit = guard.permits()[0];
            println!(
                "worker {worker} renders on slot {} with token {}",
                permit.slot, permit.token
            );
            slots.write(permit.slot, permit.token)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            guard.release().await?;
            session.close().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await?.map_err(|e| e.to_string())?;
    }
    Ok(())
}
