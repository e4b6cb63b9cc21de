//! The framed `Calls` stream as each end reads it: requests on the server,
//! answers in the Rust client, frame after frame until the bytes run out
//! or one is refused.
#![no_main]

use bytes::BytesMut;
use deadbolt_proto::frames::FrameCodec;
use deadbolt_proto::v1::{CallRequest, CallResponse};
use tokio_util::codec::Decoder;

fn read_all<In: prost::Message + Default>(bytes: &[u8]) {
    let mut codec = FrameCodec::<In, In>::new();
    let mut frames = BytesMut::from(bytes);
    while let Ok(Some(_)) = codec.decode(&mut frames) {}
}

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    read_all::<CallRequest>(bytes);
    read_all::<CallResponse>(bytes);
});
