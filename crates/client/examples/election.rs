//! Three replicas of a scheduler run for leader of `scheduler`; an
//! observer prints every change of leadership as it happens. The leader
//! proclaims its address, works a while with its term as the fencing token,
//! and resigns; the next candidate in line takes over, in FIFO order.
//!
//! ```sh
//! cargo run -p deadbolt-client --example election
//! ```

use deadbolt_client::Client;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect(["http://127.0.0.1:7070"]).await?;
    let election = client.election("scheduler");
    let mut changes = election.observe().await?;
    let observer = tokio::spawn(async move {
        for _ in 0..7 {
            match changes.next().await?.leader {
                Some(leader) => println!(
                    "observer: session {} leads in term {}, at {:?}",
                    leader.session_id, leader.term, leader.value
                ),
                None => println!("observer: nobody leads"),
            }
        }
        Ok::<_, deadbolt_client::Error>(())
    });
    let replicas = (0..3).map(|replica| {
        let (client, election) = (client.clone(), election.clone());
        tokio::spawn(async move {
            let session = client.open_session(Duration::from_secs(10)).await?;
            let address = format!("10.0.0.{replica}:8080");
            // Blocks, queued behind the candidates before it.
            let leading = election.campaign(&session, "starting").await?;
            leading.proclaim(&address).await?;
            // Work here fenced with `leading.token()`, the term.
            tokio::time::sleep(Duration::from_millis(300)).await;
            leading.resign().await?;
            session.close().await?;
            Ok::<_, deadbolt_client::Error>(())
        })
    });
    for replica in replicas.collect::<Vec<_>>() {
        replica.await??;
    }
    observer.await??;
    Ok(())
}
