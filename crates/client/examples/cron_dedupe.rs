//! Runs a "daily report" on whichever host gets the lock first; every other
//! host skips it. Start a server (`cargo run --release -- server`), then run
//! this in two terminals at once:
//!
//! ```sh
//! cargo run -p deadbolt-client --example cron_dedupe
//! ```

use deadbolt_client::Client;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), deadbolt_client::Error> {
    let client = Client::connect(["http://127.0.0.1:7070"]).await?;
    let session = client.open_session(Duration::from_secs(30)).await?;
    match session.try_lock("cron/daily-report").await? {
        Some(guard) => {
            println!("sending the report (fencing token {})", guard.token());
            tokio::time::sleep(Duration::from_secs(5)).await;
            guard.release().await?;
            println!("done");
        }
        None => println!("another host is sending the report; skipping"),
    }
    session.close().await
}
