//! Runs every scenario against every client whose driver is available:
//! the Rust client always, with framed calls and with the `Calls` stream; Python's synchronous and asyncio clients when
//! `DEADBOLT_PYTHON` names an interpreter with the `deadbolt` package
//! installed (scripts/python-client.sh makes one); TypeScript's when
//! `DEADBOLT_NODE_DRIVER` names its built driver (scripts/typescript-client.sh); Go's when
//! `DEADBOLT_GO_DRIVER` does (scripts/go-client.sh).
//! With `DEADBOLT_REQUIRE_CLIENTS=1` (CI), a missing driver fails instead of
//! skipping.

use deadbolt_conformance::{scenarios, ClientUnderTest};
use std::path::{Path, PathBuf};

/// The `deadbolt` binary the servers run: `DEADBOLT_BIN`, or the one
/// cargo built beside this package's driver.
fn server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("DEADBOLT_BIN") {
        return bin.into();
    }
    let driver = Path::new(env!("CARGO_BIN_EXE_deadbolt-conformance-driver"));
    let bin = driver.with_file_name("deadbolt");
    assert!(
        bin.exists(),
        "no server binary at {}: build it first (cargo build -p deadbolt-cli), or set DEADBOLT_BIN",
        bin.display()
    );
    bin
}

fn required() -> bool {
    std::env::var("DEADBOLT_REQUIRE_CLIENTS").is_ok_and(|value| value == "1")
}

fn rust() -> Option<ClientUnderTest> {
    Some(ClientUnderTest {
        name: "rust".into(),
        program: env!("CARGO_BIN_EXE_deadbolt-conformance-driver").into(),
        args: Vec::new(),
    })
}

/// The Rust client with its calls on the gRPC `Calls` stream rather than
/// framed calls (docs/framed-calls.md): both ways must pass.
fn rust_grpc() -> Option<ClientUnderTest> {
    Some(ClientUnderTest {
        name: "rust (Calls stream)".into(),
        program: env!("CARGO_BIN_EXE_deadbolt-conformance-driver").into(),
        args: vec!["--calls".into(), "grpc".into()],
    })
}

/// The Python driver, for the synchronous client or (`--async`) the
/// asyncio one.
fn python_driver(name: &str, flags: &[&str]) -> Option<ClientUnderTest> {
    let Some(python) = std::env::var_os("DEADBOLT_PYTHON") else {
        assert!(
            !required(),
            "DEADBOLT_PYTHON is not set (scripts/python-client.sh sets it)"
        );
        eprintln!("skipped: DEADBOLT_PYTHON is not set (scripts/python-client.sh sets it)");
        return None;
    };
    let driver =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/conformance/driver.py");
    let mut args = vec![driver.to_string_lossy().into_owned()];
    args.extend(flags.iter().map(|flag| flag.to_string()));
    Some(ClientUnderTest {
        name: name.into(),
        program: python.into(),
        args,
    })
}

/// The TypeScript client's driver, built by `scripts/typescript-client.sh`.
fn typescript() -> Option<ClientUnderTest> {
    let Some(driver) = std::env::var_os("DEADBOLT_NODE_DRIVER") else {
        assert!(
            !required(),
            "DEADBOLT_NODE_DRIVER is not set (scripts/typescript-client.sh sets it)"
        );
        eprintln!(
            "skipped: DEADBOLT_NODE_DRIVER is not set (scripts/typescript-client.sh sets it)"
        );
        return None;
    };
    Some(ClientUnderTest {
        name: "typescript".into(),
        program: "node".into(),
        args: vec![driver.to_string_lossy().into_owned()],
    })
}

/// The Go client's driver, built by `scripts/go-client.sh setup`.
fn go() -> Option<ClientUnderTest> {
    let Some(driver) = std::env::var_os("DEADBOLT_GO_DRIVER") else {
        assert!(
            !required(),
            "DEADBOLT_GO_DRIVER is not set (scripts/go-client.sh sets it)"
        );
        eprintln!("skipped: DEADBOLT_GO_DRIVER is not set (scripts/go-client.sh sets it)");
        return None;
    };
    Some(ClientUnderTest {
        name: "go".into(),
        program: driver.into(),
        args: Vec::new(),
    })
}

fn python() -> Option<ClientUnderTest> {
    python_driver("python", &[])
}

fn python_async() -> Option<ClientUnderTest> {
    python_driver("python-async", &["--async"])
}

macro_rules! scenario {
    ($client:ident, $scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $client() {
                let Some(client) = super::$client() else {
                    return;
                };
                let bin = super::server_bin();
                let outcome = super::scenarios::$scenario(&client, &bin).await;
                if let Err(error) = outcome {
                    panic!("{} client: {error:#}", client.name);
                }
            }
        }
    };
}

macro_rules! every_scenario {
    ($client:ident) => {
        mod $client {
            use super::*;
            scenario!($client, tokens_grow);
            scenario!($client, fifo_waiters);
            scenario!($client, wait_timeout);
            scenario!($client, renewal);
            scenario!($client, leader_kill);
            scenario!($client, bad_input);
            scenario!($client, tls_and_identities);

            /// Also prints the margin, for the record.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lost_before_regrant() {
                let Some(client) = $client() else { return };
                match scenarios::lost_before_regrant(&client, &server_bin()).await {
                    Ok(margin) => eprintln!(
                        "{} client: lost fired {margin:?} before the frozen server's lease could end",
                        client.name
                    ),
                    Err(error) => panic!("{} client: {error:#}", client.name),
                }
            }
        }
    };
}

every_scenario!(rust);
every_scenario!(rust_grpc);
every_scenario!(python);
every_scenario!(python_async);
every_scenario!(typescript);
every_scenario!(go);
