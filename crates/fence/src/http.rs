//! HTTP (feature `http`, on by default): [`FencingLayer`], a tower middleware
//! that lets a request reach its handler only if the fencing token in its
//! `Fencing-Token` header is not stale.
//!
//! # When the mark advances
//!
//! The gate is checked **and advanced** when the request arrives, before the
//! inner service is called, not after the handler succeeds. Advancing only
//! after success would leave a window: new holder 8 is admitted and its
//! handler is still writing when old holder 7's request arrives; the mark
//! is still below 7, so 7 is admitted too and its write can land after
//! 8's. Advancing on arrival refuses 7 from the moment 8 is admitted. The mark stays advanced even if 8's handler fails:
//! that token 8 exists proves 7's lock is gone, whatever happened to 8's
//! write.
//!
//! What no middleware can do is stop a request that was admitted *before*
//! the newer token arrived and is still inside its handler. If an old
//! holder's slow request could land its write after a newer holder's, make
//! the write itself fenced: the admitted token is in the request's
//! extensions as [`FencingToken`], ready to pass to a fenced `UPDATE` (the
//! `postgres` module) or to [`FenceGate::admit_with`].

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{ready, Either, Ready};
use http::header::{HeaderName, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::gate::{FenceGate, Stale};

/// The request header that carries the fencing token, as a decimal `u64`.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");

/// The token a request was admitted with, put in its extensions for the
/// handler (axum: `Extension<FencingToken>`). Absent if the request carried
/// no token and the layer lets such requests through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencingToken(pub u64);

/// Wraps a service so that every request must carry a current fencing token;
/// see the module documentation.
///
/// | request                                   | response                         |
/// |-------------------------------------------|----------------------------------|
/// | token ≥ highest admitted                  | the inner service's              |
/// | token < highest admitted                  | `409 Conflict`, handler not run  |
/// | no header                                 | `400 Bad Request` (by default)   |
/// | not a decimal u64, or the header twice    | `400 Bad Request`                |
///
/// Rejections have a one-line `text/plain` body; the 409 names both tokens:
/// `stale fencing token 5: this resource already accepted token 7`.
#[derive(Debug, Clone)]
pub struct FencingLayer {
    gate: Arc<FenceGate>,
    require_token: bool,
}

impl FencingLayer {
    /// Guards the wrapped service with `gate`, refusing requests without a
    /// token. Keep a clone of the `Arc` to read or restore the mark.
    pub fn new(gate: Arc<FenceGate>) -> Self {
        FencingLayer {
            gate,
            require_token: true,
        }
    }

    /// Lets requests without a `Fencing-Token` header through unchecked (for
    /// routes that only read, say). A request that carries the header is
    /// still checked, and refused if stale or malformed.
    pub fn allow_missing_token(mut self) -> Self {
        self.require_token = false;
        self
    }
}

impl<S> Layer<S> for FencingLayer {
    type Service = Fencing<S>;

    fn layer(&self, inner: S) -> Fencing<S> {
        Fencing {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`FencingLayer`] produces.
#[derive(Debug, Clone)]
pub struct Fencing<S> {
    inner: S,
    layer: FencingLayer,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Fencing<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<ResBody>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        match self.layer.admit(&request) {
            Ok(Some(token)) => {
                request.extensions_mut().insert(FencingToken(token));
                Either::Right(self.inner.call(request))
            }
            Ok(None) => Either::Right(self.inner.call(request)),
            Err(rejection) => Either::Left(ready(Ok(rejection.into_response()))),
        }
    }
}

impl FencingLayer {
    /// Reads the token and passes it through the gate: the admitted token,
    /// `None` for an allowed request without one, or why it is refused.
    fn admit<B>(&self, request: &Request<B>) -> Result<Option<u64>, Rejection> {
        let mut values = request.headers().get_all(&FENCING_TOKEN).iter();
        let Some(value) = values.next() else {
            return if self.require_token {
                Err(Rejection::Missing)
            } else {
                Ok(None)
            };
        };
        if values.next().is_some() {
            return Err(Rejection::Repeated);
        }
        let token = parse_token(value).ok_or(Rejection::Malformed)?;
        self.gate.admit(token).map_err(Rejection::Stale)?;
        Ok(Some(token))
    }
}

/// Only ASCII digits: `u64::from_str` would also take a leading `+`, and a
/// token is a plain decimal number.
fn parse_token(value: &HeaderValue) -> Option<u64> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

enum Rejection {
    Missing,
    Repeated,
    Malformed,
    Stale(Stale),
}

impl Rejection {
    fn into_response<B: From<String>>(self) -> Response<B> {
        let (status, message) = match self {
            Rejection::Missing => (
                StatusCode::BAD_REQUEST,
                "missing Fencing-Token header".to_owned(),
            ),
            Rejection::Repeated => (
                StatusCode::BAD_REQUEST,
                "more than one Fencing-Token header".to_owned(),
            ),
            Rejection::Malformed => (
                StatusCode::BAD_REQUEST,
                "malformed Fencing-Token header: expected a decimal integer below 2^64".to_owned(),
            ),
            Rejection::Stale(stale) => (StatusCode::CONFLICT, stale.to_string()),
        };
        let mut response = Response::new(B::from(message + "\n"));
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_plain_decimal_u64() {
        let parse = |s: &str| parse_token(&HeaderValue::from_str(s).unwrap());
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("42"), Some(42));
        assert_eq!(parse("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "+5",
            "-1",
            "5 ",
            "0x10",
            "1e3",
            "abc",
            "18446744073709551616",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
