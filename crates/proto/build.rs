//! Compiles `proto/deadbolt.proto` with the protoc shipped in the
//! `protoc-bin-vendored` crate, so a fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    // The HTTP/JSON API reuses these messages, so the two APIs cannot drift.
    // Absent JSON fields take their protobuf defaults.
    tonic_build::configure()
        .type_attribute(
            ".deadbolt.v1",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        .message_attribute(".deadbolt.v1", "#[serde(default)]")
        .compile_protos(&["proto/deadbolt.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/deadbolt.proto");
    Ok(())
}
