//! Clients of the other regions' nodes, one lazily connected channel each.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::{CoreError, RegionId};
use cascade_proto::v1::peer_client::PeerClient;
use cascade_proto::v1::resources_client::ResourcesClient;
use tonic::transport::{Channel, Endpoint};

/// Bound on one peer call; a peer that does not answer is unavailable.
pub const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Default)]
pub struct Peers {
    /// Region → channel to its node. Immutable after start.
    channels: Arc<BTreeMap<String, Channel>>,
}

#[derive(Debug, thiserror::Error)]
#[error("peer {region}: invalid address {addr:?}: {message}")]
pub struct PeerAddressError {
    pub region: String,
    pub addr: String,
    pub message: String,
}

impl Peers {
    pub fn new(peers: &BTreeMap<RegionId, String>) -> Result<Self, PeerAddressError> {
        let mut channels = BTreeMap::new();
        for (region, addr) in peers {
            let endpoint = Endpoint::from_shared(addr.clone()).map_err(|e| PeerAddressError {
                region: region.to_string(),
                addr: addr.clone(),
                message: e.to_string(),
            })?;
            let channel = endpoint
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .connect_lazy();
            channels.insert(region.to_string(), channel);
        }
        Ok(Self {
            channels: Arc::new(channels),
        })
    }

    pub fn regions(&self) -> impl Iterator<Item = &str> {
        self.channels.keys().map(String::as_str)
    }

    pub fn knows(&self, region: &str) -> bool {
        self.channels.contains_key(region)
    }

    fn channel(&self, region: &str) -> Result<Channel, CoreError> {
        self.channels
            .get(region)
            .cloned()
            .ok_or_else(|| CoreError::RegionUnavailable {
                region: region.to_owned(),
                reason: "not a peer of this node (see [peers] in its config)".into(),
            })
    }

    pub fn peer(&self, region: &str) -> Result<PeerClient<Channel>, CoreError> {
        Ok(PeerClient::new(self.channel(region)?)
            .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cascade_proto::MAX_MESSAGE_BYTES))
    }

    pub fn resources(&self, region: &str) -> Result<ResourcesClient<Channel>, CoreError> {
        Ok(ResourcesClient::new(self.channel(region)?)
            .max_decoding_message_size(cascade_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cascade_proto::MAX_MESSAGE_BYTES))
    }
}

/// A peer call's failure, as the protocol sees it.
pub fn unavailable(region: &str, status: &tonic::Status) -> CoreError {
    CoreError::RegionUnavailable {
        region: region.to_owned(),
        reason: format!("{:?}: {}", status.code(), status.message()),
    }
}
