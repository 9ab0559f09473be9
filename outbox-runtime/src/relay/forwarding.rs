//! The relay's side of forwarding: the sink it forwards to, and the route of a leased row to it.

use std::sync::Arc;

use crate::decode::DecodeError;
use crate::forward::{ForwardRoute, Forwarded, Sink, SinkHealth};
use crate::relay::context::RowMeta;
use crate::relay::handler::{DeliveryLease, Payload, Route, RouteFuture, Settled};

/// The sink a forwarding relay publishes to: checked at start, probed while unavailable.
pub(crate) struct Forwarding {
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) health: Arc<SinkHealth>,
}

impl<S> Route<S> for ForwardRoute {
    fn call(
        &self,
        _state: S,
        meta: RowMeta,
        payload: Payload<'_>,
        _: DeliveryLease,
    ) -> Result<RouteFuture, DecodeError> {
        let forwarded = self.forward(&meta, payload.json);
        Ok(Box::pin(async move {
            match forwarded.await {
                Forwarded::Confirmed => Ok(Settled::Handled),
                Forwarded::Unavailable(why) => Ok(Settled::Unavailable(why)),
                Forwarded::Failed(error) => Err(error),
            }
        }))
    }
}
