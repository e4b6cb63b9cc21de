//! A connection to one endpoint, as every call goes over it: the channel
//! with the caller's access token (if any) put on each call, and how long
//! dialling it may take. Below both the client (`client.rs`), which picks
//! the endpoint, and the `Calls` stream (`calls.rs`), which opens its own.

use crate::error::Error;
use deadbolt_proto::ErrorKind;
use std::time::Duration;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;

/// How long to wait for a TCP (and HTTP/2) connection before calling the
/// server unreachable.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection to one endpoint, with the caller's token (if any) on every
/// call.
pub(crate) type Link = InterceptedService<Channel, Authorization>;

/// Puts `authorization: Bearer <token>` on every call of a client made with
/// a token (see [`Client::connect_with_token`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Authorization(Option<MetadataValue<Ascii>>);

impl Authorization {
    pub(crate) fn bearer(token: Option<&str>) -> Result<Authorization, Error> {
        let Some(token) = token else {
            return Ok(Authorization(None));
        };
        let value = MetadataValue::try_from(format!("Bearer {}", token.trim())).map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                "the token holds characters a header cannot carry: copy it again from \
                 `deadbolt acl token create` (it looks like dbt.<id>.<secret>)",
            )
        })?;
        Ok(Authorization(Some(value)))
    }

    /// The `authorization` value, if any.
    pub(crate) fn value(&self) -> Option<&str> {
        self.0.as_ref().and_then(|value| value.to_str().ok())
    }

    pub(crate) fn link(&self, channel: Channel) -> Link {
        InterceptedService::new(channel, self.clone())
    }
}

impl Interceptor for Authorization {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}
