//! `deadbolt server --config FILE` and the systemd unit, as an operator
//! would use them: the real binary, a real file, `systemd-analyze verify`.

mod common;

use common::{free_port, http, BIN};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

fn wait_healthy(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(http(addr, "GET", "/health", None), Ok((200, _))) {
        assert!(Instant::now() < deadline, "no server healthy at {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn server(args: &[&str], env: &[(&str, String)], log: &Path) -> Running {
    let mut command = Command::new(BIN);
    command.arg("server").args(args).stdout(Stdio::null());
    command.stderr(std::fs::File::create(log).unwrap());
    for (key, value) in env {
        command.env(key, value);
    }
    Running(command.spawn().unwrap())
}

#[test]
fn a_config_file_sets_flags_and_the_environment_and_command_line_win() {
    let dir = tempfile::tempdir().unwrap();
    let (from_file, from_env, from_flag) = (loopback(), loopback(), loopback());
    let file = dir.path().join("deadbolt.toml");
    let data = dir.path().join("data");
    std::fs::write(
        &file,
        format!(
            "listen = \"{from_file}\"\ndata_dir = \"{}\"\nelection-timeout = \"300ms\"\nlog-format = \"json\"\n",
            data.display()
        ),
    )
    .unwrap();
    let config = file.to_str().unwrap();
    let log = dir.path().join("server.log");

    let only_file = server(&["--config", config], &[], &log);
    wait_healthy(from_file);
    let first_line = std::fs::read_to_string(&log).unwrap();
    let first_line = first_line.lines().next().unwrap_or_default().to_owned();
    assert!(
        first_line.starts_with('{'),
        "not a JSON log line: {first_line}"
    );
    drop(only_file);

    let env = [("DEADBOLT_LISTEN", from_env.to_string())];
    let with_env = server(&["--config", config], &env, &log);
    wait_healthy(from_env);
    drop(with_env);

    let _with_flag = server(
        &["--config", config, "--listen", &from_flag.to_string()],
        &env,
        &log,
    );
    wait_healthy(from_flag);
}

#[test]
fn unknown_keys_and_bad_values_are_refused_naming_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "listen = \"127.0.0.1:0\"\n\nelecton-timeout = \"300ms\"\n",
            "line 3, key \"electon-timeout\": no such setting",
        ),
        (
            "election-timeout = \"soon\"\n",
            "line 1, key \"election-timeout\": invalid value 'soon'",
        ),
        (
            "join = \"yes\"\n",
            "line 1, key \"join\": takes true or false",
        ),
        ("listen = [1\n", "TOML parse error at line 1"),
    ];
    for (text, expected) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(BIN)
            .args(["server", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("bad.toml") && stderr.contains(expected),
            "{text:?}: {stderr}"
        );
        assert!(
            !dir.path().join("data").exists(),
            "a refused start created the data directory"
        );
    }
}

/// The example config and unit in `packaging/` work as shipped.
#[test]
fn the_packaged_config_starts_a_server_and_the_systemd_unit_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging");
    let addr = loopback();
    let data = dir.path().join("data");
    let _server = server(
        &[
            "--config",
            packaging.join("deadbolt.toml").to_str().unwrap(),
            "--listen",
            &addr.to_string(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
        &dir.path().join("server.log"),
    );
    wait_healthy(addr);

    // The unit as installed, but running the binary under test.
    let unit = std::fs::read_to_string(packaging.join("deadbolt.service"))
        .unwrap()
        .replace("/usr/local/bin/deadbolt", BIN);
    let installed = dir.path().join("deadbolt.service");
    std::fs::write(&installed, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&installed)
        .output()
        .expect("systemd-analyze (Debian's systemd package) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Unknown or misspelt directives are only warned about.
    assert!(stderr.trim().is_empty(), "{stderr}");
}
