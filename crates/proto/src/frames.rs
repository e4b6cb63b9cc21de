//! The framed form of the `Calls` stream: the same `CallRequest` and
//! `CallResponse` messages, each behind a 4-byte big-endian length, on a
//! plain connection of their own instead of an HTTP/2 stream.
//!
//! Why: a tonic stream that does no work costs a one-thread server 12.6-15.6
//! µs of CPU per message on the benchmark machine, plain frames 7.1-9.2
//! (`scripts/transport-floor.sh`, bench/results/2026-12-05.md), and that
//! difference was most of what stood between Deadbolt and Redis's CPU per
//! lock operation (issue 33). The handshake and the rules are in
//! `proto/deadbolt.proto` (`CallsHello`).
//!
//! [`FrameCodec`] frames a protobuf message on each side: one type for
//! both ends, so the two cannot frame differently.

use bytes::{Buf, BufMut, BytesMut};
use prost::Message;
use std::io;
use std::marker::PhantomData;
use tokio_util::codec::{Decoder, Encoder};

/// What a client sends first on a connection to the client port to ask
/// for framed calls. Its first byte (NUL) starts neither a TLS handshake
/// (0x16) nor an HTTP request (a letter), so a server tells the three apart
/// from one byte; a server older than framed calls answers it as a
/// malformed HTTP request, or closes, and the client uses gRPC instead.
/// At least as long as HTTP/2's own connection preface (24 bytes): an
/// HTTP/2 proxy reads that many before it judges, and with the 22 bytes of
/// a shorter preface and an empty hello haproxy waited, so the client fell
/// back only after its 3 s (`framed_calls.rs`, the proxy test).
pub const PREFACE: &[u8] = b"\0deadbolt-framed-calls/1\n";

/// The ALPN protocol id a TLS client offers for framed calls: the server
/// agrees to it in the handshake (where HTTP clients agree to `h2`), and
/// the preface and frames then go inside TLS. A server older than framed
/// calls agrees to none of the client's protocols and fails the handshake.
pub const ALPN: &[u8] = b"deadbolt-framed-calls/1";

/// The largest message either side sends or accepts. A call carries a
/// lock name (at most 512 bytes) and a few numbers; the client refuses to
/// send one over 64 KiB. A larger frame ends the connection.
pub const MAX_FRAME_BYTES: usize = 128 * 1024;

/// The length before each message.
const LENGTH_BYTES: usize = 4;

/// Frames `Out` messages for sending and reads `In` messages.
///
/// Written out rather than tokio-util's `LengthDelimitedCodec` under a
/// message codec: that one split each frame off the read buffer as a
/// `BytesMut` of its own (a reference count taken and given back per
/// message), and prost then decoded from it through `Buf`, paying
/// `BytesMut::advance` for every field. Here a message is decoded from a
/// slice of the read buffer, which then drops the frame at once.
#[derive(Debug)]
pub struct FrameCodec<Out, In> {
    messages: PhantomData<fn(Out) -> In>,
}

impl<Out, In> FrameCodec<Out, In> {
    pub fn new() -> Self {
        FrameCodec {
            messages: PhantomData,
        }
    }
}

impl<Out, In> Default for FrameCodec<Out, In> {
    fn default() -> Self {
        Self::new()
    }
}

impl<Out: Message, In> Encoder<Out> for FrameCodec<Out, In> {
    type Error = io::Error;

    fn encode(&mut self, message: Out, frames: &mut BytesMut) -> io::Result<()> {
        let length = message.encoded_len();
        if length > MAX_FRAME_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a message of {length} bytes; a frame holds at most {MAX_FRAME_BYTES}"),
            ));
        }
        frames.reserve(LENGTH_BYTES + length);
        frames.put_u32(length as u32);
        // `encode_raw`, not `encode`, which would work the length out again
        // only to check the room reserved just above.
        message.encode_raw(frames);
        Ok(())
    }
}

impl<Out, In: Message + Default> Decoder for FrameCodec<Out, In> {
    type Item = In;
    type Error = io::Error;

    fn decode(&mut self, frames: &mut BytesMut) -> io::Result<Option<In>> {
        let Some(length) = frames.get(..LENGTH_BYTES) else {
            return Ok(None);
        };
        let length = u32::from_be_bytes(length.try_into().expect("four bytes")) as usize;
        if length > MAX_FRAME_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {length} bytes; a frame holds at most {MAX_FRAME_BYTES}"),
            ));
        }
        let Some(message) = frames.get(LENGTH_BYTES..LENGTH_BYTES + length) else {
            // Room for the rest of the frame, read in as it arrives.
            frames.reserve(LENGTH_BYTES + length - frames.len());
            return Ok(None);
        };
        let message =
            In::decode(message).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
        frames.advance(LENGTH_BYTES + length);
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{call_request::Call, CallRequest, CancelCall};

    #[test]
    fn a_message_comes_back_as_it_went_and_only_once_whole() {
        let mut codec = FrameCodec::<CallRequest, CallRequest>::new();
        let request = CallRequest {
            id: 7,
            call: Some(Call::Cancel(CancelCall {})),
        };
        let mut wire = BytesMut::new();
        codec.encode(request.clone(), &mut wire).unwrap();
        codec.encode(request.clone(), &mut wire).unwrap();
        let length = request.encoded_len();
        assert_eq!(&wire[..4], (length as u32).to_be_bytes());
        // Half a frame is not a message yet.
        let mut arriving = wire.split_to(2 + length / 2);
        assert_eq!(codec.decode(&mut arriving).unwrap(), None);
        arriving.unsplit(wire);
        assert_eq!(codec.decode(&mut arriving).unwrap(), Some(request.clone()));
        assert_eq!(codec.decode(&mut arriving).unwrap(), Some(request));
        assert_eq!(codec.decode(&mut arriving).unwrap(), None);
    }

    #[test]
    fn a_frame_over_the_limit_is_an_error_both_ways() {
        let mut codec = FrameCodec::<CallRequest, CallRequest>::new();
        let mut wire = BytesMut::new();
        wire.put_u32(MAX_FRAME_BYTES as u32 + 1);
        assert!(codec.decode(&mut wire).is_err());

        let huge = crate::v1::CallsHello {
            authorization: "x".repeat(MAX_FRAME_BYTES),
        };
        let mut codec = FrameCodec::<crate::v1::CallsHello, CallRequest>::new();
        let err = codec.encode(huge, &mut BytesMut::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_preface_starts_neither_tls_nor_http_and_is_no_shorter_than_http2s() {
        assert_ne!(PREFACE[0], 0x16);
        assert!(!PREFACE[0].is_ascii_alphabetic());
        assert!(PREFACE.len() >= b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".len());
    }
}
