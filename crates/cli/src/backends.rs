//! `deadbolt backends`: what each lock system `run --backend` and `bench
//! --backend` speak to guarantees, from `deadbolt-backends`' labels (the
//! same table as docs/backends.md), so the trade-off is visible where the
//! choice is made. Offline: it connects to nothing.

use crate::exit;
use deadbolt_backends::LABELS;

#[derive(clap::Args)]
pub struct BackendsArgs {
    /// One JSON object per backend, in an array.
    #[arg(long)]
    json: bool,
}

pub fn main(args: BackendsArgs) -> i32 {
    if args.json {
        let labels: Vec<_> = LABELS
            .iter()
            .map(|label| {
                serde_json::json!({
                    "backend": label.name,
                    "url": label.url,
                    "seeds": label.seeds,
                    "server_crash": label.server_crash,
                    "failover": label.failover,
                    "client_pause": label.client_pause,
                    "token": label.token,
                    "primitives": label.primitives,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(labels));
        return exit::OK;
    }
    for label in &LABELS {
        println!("{}  {}", label.name, label.url);
        for (what, text) in [
            ("seeds say", label.seeds),
            ("server crash", label.server_crash),
            ("failover", label.failover),
            ("client pause", label.client_pause),
            ("token", label.token),
            ("primitives", label.primitives),
        ] {
            println!("  {what:<13} {text}");
        }
        println!();
    }
    exit::OK
}
