//! Compiles `proto/deadbolt.proto` with the protoc shipped in the
//! `protoc-bin-vendored` crate, so a fresh machine needs no system protoc.
//!
//! Also writes two descriptor sets into `OUT_DIR` for
//! `tests/compatibility.rs`: this proto's (`current.bin`) and the latest
//! release's, kept in `compat/<release>/deadbolt.proto` (`released.bin`).

use std::path::PathBuf;

/// The release whose proto the current one must stay compatible with:
/// `compat/<RELEASED>/deadbolt.proto`, copied there when it was tagged.
const RELEASED: &str = "0.1.0";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", &protoc);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The HTTP/JSON API reuses these messages, so the two APIs cannot drift.
    // Absent JSON fields take their protobuf defaults.
    tonic_build::configure()
        .type_attribute(
            ".deadbolt.v1",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        .message_attribute(".deadbolt.v1", "#[serde(default)]")
        .file_descriptor_set_path(out.join("current.bin"))
        .compile_protos(&["proto/deadbolt.proto"], &["proto"])?;
    let released_dir = format!("compat/{RELEASED}");
    let status = std::process::Command::new(&protoc)
        .arg(format!(
            "--descriptor_set_out={}",
            out.join("released.bin").display()
        ))
        .arg(format!("-I{released_dir}"))
        .arg(format!("{released_dir}/deadbolt.proto"))
        .status()?;
    if !status.success() {
        return Err(format!("protoc could not compile {released_dir}/deadbolt.proto").into());
    }
    println!("cargo:rerun-if-changed=proto/deadbolt.proto");
    println!("cargo:rerun-if-changed={released_dir}/deadbolt.proto");
    Ok(())
}
