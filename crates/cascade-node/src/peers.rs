//! Clients of the other regions' nodes, one lazily connected channel each.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cascade_core::{CoreError, RegionId};
use cascade_proto::v1::peer_client::PeerClient;
use cascade_proto::v1::resources_client::ResourcesClient;
use cascade_tls::NodeTls;
use tonic::transport::{Channel, Endpoint};

/// Bound on one peer call; a peer that does not answer is unavailable.
pub const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Peers {
    /// Region → channel to its node. Immutable after start.
    channels: Arc<BTreeMap<String, Channel>>,
    /// Largest message either way; the same limit the node's server enforces.
    max_message_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("peer {region}: invalid address {addr:?}: {message}")]
pub struct PeerAddressError {
    pub region: String,
    pub addr: String,
    pub message: String,
}

impl Peers {
    /// With `tls`, each channel presents this node's certificate and accepts
    /// only a server certificate naming the region it is listed as.
    pub fn new(
        peers: &BTreeMap<RegionId, String>,
        tls: Option<&NodeTls>,
        max_message_bytes: usize,
    ) -> Result<Self, PeerAddressError> {
        let mut channels = BTreeMap::new();
        for (region, addr) in peers {
            let invalid = |message: String| PeerAddressError {
                region: region.to_string(),
                addr: addr.clone(),
                message,
            };
            let mut endpoint = Endpoint::from_shared(addr.clone()).map_err(|e| invalid(e.to_string()))?;
            if let Some(tls) = tls {
                endpoint = endpoint
                    .tls_config(tls.peer_client_config(region.as_str()))
                    .map_err(|e| invalid(e.to_string()))?;
            }
            let channel = endpoint
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .connect_lazy();
            channels.insert(region.to_string(), channel);
        }
        Ok(Self {
            channels: Arc::new(channels),
            max_message_bytes,
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
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes))
    }

    pub fn resources(&self, region: &str) -> Result<ResourcesClient<Channel>, CoreError> {
        Ok(ResourcesClient::new(self.channel(region)?)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes))
    }
}

/// A peer call's failure, as the protocol sees it.
pub fn unavailable(region: &str, status: &tonic::Status) -> CoreError {
    CoreError::RegionUnavailable {
        region: region.to_owned(),
        reason: format!("{:?}: {}", status.code(), status.message()),
    }
}
