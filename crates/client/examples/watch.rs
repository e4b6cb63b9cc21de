//! Follows every name under a prefix and prints each event as it happens:
//! who took or gave up which lock, semaphore, read/write lock or election,
//! with which token, and each store write. Pass an event id (the first
//! column) to resume after it, as a restarted follower would: nothing in
//! between is missed.
//!
//! ```sh
//! cargo run -p deadbolt-client --example watch -- jobs/
//! cargo run -p deadbolt-client --example watch -- jobs/ 1042.0
//! ```

use deadbolt_client::{Client, WatchOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let prefix = args.next().unwrap_or_default();
    let after = args.next();
    let client = Client::connect(["http://127.0.0.1:7070"]).await?;
    let options = WatchOptions {
        prefix: true,
        after,
    };
    let mut watch = client.watch(&prefix, options);
    while let Some(event) = watch.next().await {
        // `compacted`: the history asked for is gone; read the state and
        // watch again from now.
        let event = event?;
        println!(
            "{} {} {} session={} token={}",
            event.id, event.kind, event.name, event.session_id, event.token
        );
    }
    Ok(())
}
