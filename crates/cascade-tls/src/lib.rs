//! Transport security between region nodes: mutual TLS on rustls, and a
//! region's identity read from its certificate.
//!
//! # Identity
//!
//! A region's certificate names the region in a DNS subject alternative
//! name `{region}.cascade` ([`identity_name`]). That one name is used both
//! ways:
//!
//! - a node calling a peer sets the TLS server name to the *region it means
//!   to reach*, so a wrong or hijacked address cannot pose as that region;
//! - the called node reads the caller's region from its client certificate
//!   ([`peer_region`]) and the Peer service refuses calls made in another
//!   region's name (a region may attach, release and watch only as itself).
//!
//! Clients of the Resources API need only the CA: client certificates are
//! optional at the handshake, and it is the Peer service that requires one.
//!
//! # Client certificates: checked after the handshake
//!
//! The handshake ([`ServerTls::config`]) asks for a client certificate but
//! checks only that the client holds its key (the handshake signatures);
//! it accepts any chain. The node then classifies the chain once per
//! connection ([`ServerTls::classify`], webpki exactly as rustls would
//! verify it): of the cluster's CA (`[tls] ca`: a region or a client), of
//! `[auth] client_ca` (a client only: such a leaf naming a region,
//! `*.cascade`, is untrusted, only the cluster's CA certifies regions), or
//! untrusted. So a certificate of another CA gets a gRPC status
//! (UNAUTHENTICATED, from the node) instead of a failed handshake the
//! client cannot tell from a network fault.
//!
//! # Layout
//!
//! - [`TlsFiles`], [`NodeTls`]: a node's PEM files, loaded and checked, and
//!   the server ([`ServerTls`]) and tonic client configurations built from
//!   them; [`ClientCa`], `[auth] client_ca`.
//! - [`ClientTls`]: what a CLI or library client needs (the CA, optionally
//!   an identity).
//! - [`peer_region`]: the region of a verified peer certificate chain.
//! - [`DevPki`]: a development CA and per-region certificates (`cascade
//!   dev-certs`, the demo, the tests). Production deployments bring their
//!   own PKI and only have to follow the naming rule above.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cascade_core::RegionId;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The DNS name suffix that marks a region identity in a certificate.
pub const IDENTITY_SUFFIX: &str = ".cascade";

/// The subject alternative name that carries `region`'s identity.
pub fn identity_name(region: &str) -> String {
    format!("{region}{IDENTITY_SUFFIX}")
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
}

fn invalid(what: impl Into<String>, message: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        what: what.into(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Where a node's TLS material lives: the `[tls]` section of its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA certificate: peers (and clients) are verified against it.
    pub ca: PathBuf,
    /// This node's certificate (naming its region), PEM.
    pub cert: PathBuf,
    /// This node's private key, PEM.
    pub key: PathBuf,
}

/// A node's loaded TLS material, with the region its certificate names.
#[derive(Clone)]
pub struct NodeTls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    /// The region the certificate names, checked against the node's own at start.
    region: RegionId,
}

impl std::fmt::Debug for NodeTls {
    // Never print the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl NodeTls {
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let label = |p: &Path| p.display().to_string();
        Self::parse(
            [read(&files.ca)?, read(&files.cert)?, read(&files.key)?],
            [label(&files.ca), label(&files.cert), label(&files.key)],
        )
    }

    /// Checks the PEMs parse and the certificate names exactly one region.
    pub fn from_pem(ca_pem: String, cert_pem: String, key_pem: String) -> Result<Self, TlsError> {
        Self::parse([ca_pem, cert_pem, key_pem], ["ca".into(), "cert".into(), "key".into()])
    }

    /// `labels` name the CA, certificate and key in errors (file paths, when loaded).
    fn parse([ca_pem, cert_pem, key_pem]: [String; 3], [ca, cert, key]: [String; 3]) -> Result<Self, TlsError> {
        first_certificate_der(&ca_pem).map_err(|m| invalid(ca, m))?;
        let leaf = first_certificate_der(&cert_pem).map_err(|m| invalid(cert.clone(), m))?;
        KeyPair::from_pem(&key_pem).map_err(|e| invalid(key, format!("not a usable private key: {e}")))?;
        let region = region_of_certificate(&leaf).map_err(|m| invalid(cert, m))?;
        Ok(Self {
            ca_pem,
            cert_pem,
            key_pem,
            region,
        })
    }

    /// The region this node's certificate names.
    pub fn region(&self) -> &RegionId {
        &self.region
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }

    fn ca(&self) -> Certificate {
        Certificate::from_pem(&self.ca_pem)
    }

    /// The server side: present this node's certificate, ask for a client
    /// certificate without requiring one, and tell afterwards which CA, if
    /// any, issued the one offered: the cluster's, or `client_ca` (see the
    /// crate doc, "Client certificates").
    pub fn server(&self, client_ca: Option<&ClientCa>) -> Result<ServerTls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cluster_roots = roots(&self.ca_pem).map_err(|m| invalid("ca", m))?;
        let client_roots = client_ca
            .map(|ca| roots(&ca.pem).map_err(|m| invalid(ca.label.clone(), m)))
            .transpose()?;
        let mut offered = cluster_roots.clone();
        if let Some(clients) = &client_roots {
            offered.roots.extend(clients.roots.iter().cloned());
        }
        let verifier = |roots: RootCertStore| {
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| invalid("client certificate verifier", e.to_string()))
        };
        let handshake = KeyPossessionOnly {
            // Its root hints name both CAs, so a client holding several
            // certificates may pick the right one.
            webpki: verifier(offered)?,
        };
        let cluster = verifier(cluster_roots)?;
        let clients = client_roots.map(verifier).transpose()?;
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("cert", format!("unreadable PEM: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| invalid("key", format!("not a usable private key: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("tls", e.to_string()))?
            .with_client_cert_verifier(Arc::new(handshake))
            .with_single_cert(chain, key)
            .map_err(|e| invalid("cert", e.to_string()))?;
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            cluster,
            clients,
            has_client_ca: client_ca.is_some(),
        })
    }

    /// Calling the node of `peer`: the server must prove it *is* that region.
    pub fn peer_client_config(&self, peer: &str) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca())
            .identity(self.identity())
            .domain_name(identity_name(peer))
    }

    /// This node's material as a client identity (the invariant checker run by an operator).
    pub fn as_client(&self) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_pem.clone(),
            identity: Some((self.cert_pem.clone(), self.key_pem.clone())),
            server_name: None,
        }
    }
}

/// `[auth] client_ca`: a CA whose certificates identify clients (never
/// regions), besides the cluster's.
#[derive(Clone)]
pub struct ClientCa {
    pem: String,
    /// Names the file in errors.
    label: String,
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa")
            .field("file", &self.label)
            .finish_non_exhaustive()
    }
}

impl ClientCa {
    /// Reads and checks the PEM file (one CA certificate or more).
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        let label = path.display().to_string();
        Self::parse(read(path)?, label)
    }

    /// Checks `pem` holds at least one usable CA certificate.
    pub fn from_pem(pem: String) -> Result<Self, TlsError> {
        Self::parse(pem, "client_ca".to_owned())
    }

    fn parse(pem: String, label: String) -> Result<Self, TlsError> {
        roots(&pem).map_err(|m| invalid(label.clone(), m))?;
        Ok(Self { pem, label })
    }
}

/// The server side of a node's TLS: the rustls configuration its acceptor
/// handshakes with, and the verifiers that classify a client's chain after
/// the handshake.
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    /// The cluster's CA alone.
    cluster: Arc<dyn ClientCertVerifier>,
    /// `[auth] client_ca` alone.
    clients: Option<Arc<dyn ClientCertVerifier>>,
    has_client_ca: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("client_ca", &self.has_client_ca)
            .finish_non_exhaustive()
    }
}

/// What a client's certificate makes of the connection (see
/// [`ServerTls::classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientCertificate {
    /// None offered: served as any client without one.
    Absent,
    /// Issued by the cluster's CA: a region, or a client.
    OfCluster,
    /// Issued by `[auth] client_ca`: a client, never a region.
    OfClientCa,
    /// Neither: nothing on this connection may reach a service.
    Untrusted(Untrusted),
}

/// Why a client certificate is not trusted, as the client is told: the
/// certificate's subject and names (bounded), what is wrong, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untrusted(String);

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl ServerTls {
    /// What an acceptor handshakes with.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }

    /// Classifies the chain a client offered (`peer_certificates()` of the
    /// finished handshake: the leaf first), verified at `now` as rustls
    /// would at the handshake: against the cluster's CA, then against
    /// `client_ca`, where a leaf naming a region is untrusted.
    pub fn classify(&self, chain: Option<&[CertificateDer<'_>]>, now: SystemTime) -> ClientCertificate {
        let Some((leaf, intermediates)) = chain.and_then(<[_]>::split_first) else {
            return ClientCertificate::Absent;
        };
        let now = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default());
        let of_cluster = match self.cluster.verify_client_cert(leaf, intermediates, now) {
            Ok(_) => return ClientCertificate::OfCluster,
            Err(e) => e,
        };
        if let Some(clients) = &self.clients {
            match clients.verify_client_cert(leaf, intermediates, now) {
                Ok(_) => {
                    let regions = region_like_names(leaf);
                    if regions.is_empty() {
                        return ClientCertificate::OfClientCa;
                    }
                    return ClientCertificate::Untrusted(Untrusted(format!(
                        "the client certificate {} names a region ({}) but is issued by [auth] client_ca, \
                         which certifies clients only: a region's certificate must be of the cluster's CA ([tls] ca)",
                        describe(leaf),
                        cascade_core::limits::quote(&regions.join(", "))
                    )));
                }
                // It chains to client_ca and fails there (expired, not for
                // client authentication): that is the reason to give.
                Err(e) if !not_issued_by(&e) => {
                    return ClientCertificate::Untrusted(self.untrusted(leaf, &e));
                }
                Err(_) => {}
            }
        }
        ClientCertificate::Untrusted(self.untrusted(leaf, &of_cluster))
    }

    fn untrusted(&self, leaf: &CertificateDer<'_>, error: &rustls::Error) -> Untrusted {
        let why = match error {
            e if not_issued_by(e) => "is not issued by a CA this node trusts".to_owned(),
            rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
                "has expired".to_owned()
            }
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
            ) => "is not valid yet".to_owned(),
            rustls::Error::InvalidCertificate(
                CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
            ) => "is not for client authentication".to_owned(),
            other => format!("does not verify ({other})"),
        };
        let trusted = if self.has_client_ca {
            "of the cluster's CA ([tls] ca) or of [auth] client_ca"
        } else {
            "of the cluster's CA ([tls] ca)"
        };
        Untrusted(format!(
            "the client certificate {} {why}: connect with a certificate {trusted}, or with none",
            describe(leaf)
        ))
    }
}

/// The handshake's verifier: a client that offers a certificate must hold
/// its key (the handshake signatures, checked by webpki's verifier), but
/// any chain is accepted here; [`ServerTls::classify`] decides after the
/// handshake, so that a stranger is answered with a gRPC status.
#[derive(Debug)]
struct KeyPossessionOnly {
    webpki: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for KeyPossessionOnly {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether verifying against a CA failed because the CA did not issue
/// the chain: no issuer of that name, or one of the same name whose key
/// did not sign it (another CA with the same subject, as every
/// [`DevPki`]'s is).
fn not_issued_by(error: &rustls::Error) -> bool {
    matches!(
        error,
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature)
    )
}

/// Every certificate of a PEM text as trust anchors (at least one).
fn roots(pem: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let mut found = 0;
    for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = der.map_err(|e| format!("unreadable PEM: {e}"))?;
        found += 1;
        roots
            .add(der)
            .map_err(|e| format!("certificate {found} is not a usable CA: {e}"))?;
    }
    if found == 0 {
        return Err("no PEM certificate found".to_owned());
    }
    Ok(roots)
}

/// The DNS names of a leaf that claim a region's identity (`*.cascade`,
/// in any case), whether or not the rest is a valid region id.
fn region_like_names(leaf: &[u8]) -> Vec<String> {
    match subject_alt_names(leaf) {
        Ok(names) => names
            .dns
            .into_iter()
            .filter(|dns| dns.to_ascii_lowercase().ends_with(IDENTITY_SUFFIX))
            .collect(),
        // Unreadable names cannot be told from a region's: not a client's.
        Err(_) => vec!["(unreadable subject alternative names)".to_owned()],
    }
}

/// A certificate as a refusal names it: its subject and SANs, each quoted
/// (`limits::quote`, so a hostile certificate's names stay short).
fn describe(leaf: &[u8]) -> String {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else {
        return "(not readable as X.509)".to_owned();
    };
    let subject = cascade_core::limits::quote(&cert.subject().to_string());
    match subject_alt_names(leaf) {
        Ok(names) if !names.dns.is_empty() || !names.uris.is_empty() => {
            let listed: Vec<String> = names.uris.into_iter().chain(names.dns).collect();
            format!(
                "(subject {subject}, SAN {})",
                cascade_core::limits::quote(&listed.join(", "))
            )
        }
        _ => format!("(subject {subject})"),
    }
}

/// What a client needs to talk to TLS-enabled nodes.
#[derive(Clone, Default)]
pub struct ClientTls {
    pub ca_pem: String,
    /// Certificate and key to present (needed only for Peer calls, e.g. `cascade check`).
    pub identity: Option<(String, String)>,
    /// Overrides the name the server certificate is checked against (e.g.
    /// `eu-west.cascade` when connecting by an address the certificate does not list).
    pub server_name: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("identity", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    pub fn load(ca: &Path, identity: Option<(&Path, &Path)>, server_name: Option<String>) -> Result<Self, TlsError> {
        let ca_pem = read(ca)?;
        first_certificate_der(&ca_pem).map_err(|m| invalid(ca.display().to_string(), m))?;
        let identity = match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        Ok(Self {
            ca_pem,
            identity,
            server_name,
        })
    }

    pub fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

/// The region a peer's (already verified) certificate chain names.
pub fn peer_region(chain: &[impl AsRef<[u8]>]) -> Result<RegionId, String> {
    let leaf = chain.first().ok_or("no client certificate")?;
    region_of_certificate(leaf.as_ref())
}

/// The DNS subject alternative names of a peer's (already verified) leaf
/// certificate: what the Admin service matches against `[admin] identities`.
pub fn certificate_dns_names(chain: &[impl AsRef<[u8]>]) -> Vec<String> {
    let Some(leaf) = chain.first() else {
        return Vec::new();
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
        .collect()
}

/// A leaf certificate's subject alternative names a client identity may be:
/// DNS names and URIs (SPIFFE ids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubjectAltNames {
    pub dns: Vec<String>,
    pub uris: Vec<String>,
}

/// The DNS and URI subject alternative names of a DER certificate.
pub fn subject_alt_names(der: &[u8]) -> Result<SubjectAltNames, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| format!("is not X.509: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("has unreadable subject alternative names: {e}"))?;
    let mut names = SubjectAltNames::default();
    for name in san.iter().flat_map(|san| san.value.general_names.iter()) {
        match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => names.dns.push((*dns).to_owned()),
            x509_parser::extensions::GeneralName::URI(uri) => names.uris.push((*uri).to_owned()),
            _ => {}
        }
    }
    Ok(names)
}

fn region_of_certificate(der: &[u8]) -> Result<RegionId, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("bad subject alternative names: {e}"))?;
    let mut regions = Vec::new();
    for name in san.iter().flat_map(|san| san.value.general_names.iter()) {
        if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
            if let Some(region) = dns.strip_suffix(IDENTITY_SUFFIX) {
                // The name reaches a refusal and a warning (`caller`, in
                // `api/peer.rs`): quoted, as client input is.
                regions.push(
                    RegionId::parse(region)
                        .map_err(|e| format!("DNS name {}: {e}", cascade_core::limits::quote(dns)))?,
                );
            }
        }
    }
    match regions.as_slice() {
        [region] => Ok(region.clone()),
        [] => Err(format!(
            "names no region (expected a DNS subject alternative name \"<region>{IDENTITY_SUFFIX}\")"
        )),
        many => {
            let listed: Vec<&str> = many.iter().map(RegionId::as_str).collect();
            Err(format!(
                "names {} regions ({}); a region certificate names one",
                many.len(),
                cascade_core::limits::quote(&listed.join(", "))
            ))
        }
    }
}

fn first_certificate_der(pem: &str) -> Result<Vec<u8>, String> {
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| format!("no PEM certificate found: {e}"))?;
    if block.label != "CERTIFICATE" {
        return Err(format!("expected a PEM CERTIFICATE, found {:?}", block.label));
    }
    Ok(block.contents)
}

/// A development PKI: a CA and one certificate per region. For local
/// clusters, the demo and tests; not a substitute for a real CA.
pub struct DevPki {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    /// Region → (certificate PEM, key PEM).
    pub regions: BTreeMap<String, (String, String)>,
    /// Client name → (certificate PEM, key PEM): people and tools (see
    /// [`DevPki::issue_client`]).
    pub clients: BTreeMap<String, (String, String)>,
}

const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const REGION_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

impl DevPki {
    /// A fresh CA and a certificate for each region.
    pub fn generate(regions: &[&str]) -> Result<Self, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Cascade development CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params, CA_VALIDITY);
        let ca_cert = params.self_signed(&ca_key)?;
        let mut pki = Self {
            ca_cert_pem: ca_cert.pem(),
            ca_key_pem: ca_key.serialize_pem(),
            regions: BTreeMap::new(),
            clients: BTreeMap::new(),
        };
        for region in regions {
            pki.add_region(region)?;
        }
        Ok(pki)
    }

    /// Reads `ca.pem` and `ca.key` from `dir`.
    pub fn load_ca(dir: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            ca_cert_pem: read(&dir.join("ca.pem"))?,
            ca_key_pem: read(&dir.join("ca.key"))?,
            regions: BTreeMap::new(),
            clients: BTreeMap::new(),
        })
    }

    /// Issues `region`'s certificate: names `{region}.cascade` (its
    /// identity), `localhost` and 127.0.0.1 (so local clients can connect
    /// by address), usable as server and as client.
    pub fn add_region(&mut self, region: &str) -> Result<(), TlsError> {
        RegionId::parse(region).map_err(|e| invalid(format!("region {region:?}"), e.to_string()))?;
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.ca_cert_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![
            identity_name(region),
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
        ])?;
        params.distinguished_name.push(DnType::CommonName, region);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        set_validity(&mut params, REGION_VALIDITY);
        let cert = params.signed_by(&key, &issuer)?;
        self.regions
            .insert(region.to_owned(), (cert.pem(), key.serialize_pem()));
        Ok(())
    }

    /// Issues a client certificate (no server use) whose DNS name is `name`,
    /// for a person or tool: `[admin] identities` lists such names. Returns
    /// its certificate and key, PEM.
    pub fn issue_client(&self, name: &str) -> Result<(String, String), TlsError> {
        if name.is_empty()
            || name.ends_with(IDENTITY_SUFFIX) && RegionId::parse(name.trim_end_matches(IDENTITY_SUFFIX)).is_ok()
        {
            return Err(invalid(
                format!("client name {name:?}"),
                "must not be a region's identity",
            ));
        }
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.ca_cert_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        set_validity(&mut params, REGION_VALIDITY);
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Issues a client certificate named `name` and keeps it (written by
    /// [`DevPki::write`] as `{name}.pem` / `{name}.key`).
    pub fn add_client(&mut self, name: &str) -> Result<(), TlsError> {
        let issued = self.issue_client(name)?;
        self.clients.insert(name.to_owned(), issued);
        Ok(())
    }

    /// `region`'s material as a node loads it.
    pub fn node_tls(&self, region: &str) -> Result<NodeTls, TlsError> {
        let (cert, key) = self
            .regions
            .get(region)
            .ok_or_else(|| invalid(format!("region {region:?}"), "has no certificate in this PKI"))?;
        NodeTls::from_pem(self.ca_cert_pem.clone(), cert.clone(), key.clone())
    }

    /// A client that trusts this CA and presents no certificate.
    pub fn client(&self) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_cert_pem.clone(),
            identity: None,
            server_name: None,
        }
    }

    /// Writes `ca.pem`, `ca.key` and `{region}.pem`, `{region}.key` for each
    /// region into `dir`; keys are readable by the owner only. Returns the
    /// files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, TlsError> {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
            path: dir.to_owned(),
            source,
        })?;
        let mut files = vec![
            write_file(&dir.join("ca.pem"), &self.ca_cert_pem, false)?,
            write_file(&dir.join("ca.key"), &self.ca_key_pem, true)?,
        ];
        for (name, (cert, key)) in self.regions.iter().chain(&self.clients) {
            files.push(write_file(&dir.join(format!("{name}.pem")), cert, false)?);
            files.push(write_file(&dir.join(format!("{name}.key")), key, true)?);
        }
        Ok(files)
    }
}

// The sanctioned place in this crate: X.509 validity is wall-clock time by
// definition, and only the development PKI generates certificates.
#[allow(clippy::disallowed_methods)]
fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = SystemTime::now();
    // An hour of slack for clocks that disagree a little.
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = (now + validity).into();
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<PathBuf, TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(err)?;
    std::io::Write::write_all(&mut file, contents.as_bytes()).map_err(err)?;
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_certificates_name_their_region() {
        let pki = DevPki::generate(&["eu-west", "us-east"]).unwrap();
        let tls = pki.node_tls("eu-west").unwrap();
        assert_eq!(tls.region().as_str(), "eu-west");
        let der = first_certificate_der(&pki.regions["us-east"].0).unwrap();
        assert_eq!(peer_region(&[der]).unwrap().as_str(), "us-east");
    }

    #[test]
    fn a_certificate_without_a_region_name_is_refused() {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let err = peer_region(&[cert.der().to_vec()]).unwrap_err();
        assert!(err.contains("names no region"), "{err}");
        let pki = DevPki::generate(&[]).unwrap();
        let err = NodeTls::from_pem(pki.ca_cert_pem.clone(), cert.pem(), key.serialize_pem()).unwrap_err();
        assert!(err.to_string().starts_with("cert: names no region"), "{err}");
    }

    #[test]
    fn garbage_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let pki = DevPki::generate(&["eu-west"]).unwrap();
        pki.write(dir.path()).unwrap();
        std::fs::write(dir.path().join("eu-west.key"), "not a key").unwrap();
        let files = TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("eu-west.pem"),
            key: dir.path().join("eu-west.key"),
        };
        let err = NodeTls::load(&files).unwrap_err().to_string();
        assert!(err.contains("eu-west.key") && err.contains("private key"), "{err}");
        let key_as_ca = TlsFiles {
            ca: dir.path().join("ca.key"),
            ..files.clone()
        };
        let err = NodeTls::load(&key_as_ca).unwrap_err().to_string();
        assert!(
            err.contains("ca.key") && err.contains("expected a PEM CERTIFICATE"),
            "{err}"
        );
        let missing = TlsFiles {
            ca: dir.path().join("nope.pem"),
            ..files
        };
        assert!(NodeTls::load(&missing).unwrap_err().to_string().contains("nope.pem"));
    }

    fn leaf(pem: &str) -> Vec<CertificateDer<'static>> {
        vec![CertificateDer::from(first_certificate_der(pem).unwrap())]
    }

    #[allow(clippy::disallowed_methods)] // a test: certificates are valid now
    fn now() -> SystemTime {
        SystemTime::now()
    }

    #[test]
    fn a_chain_is_of_the_cluster_of_client_ca_or_untrusted() {
        let cluster = DevPki::generate(&["eu-west", "us-east"]).unwrap();
        // A CA for clients; its own "eu-west" certificate poses as a region.
        let clients = DevPki::generate(&["eu-west"]).unwrap();
        let stranger = DevPki::generate(&[]).unwrap();
        let client_ca = ClientCa::from_pem(clients.ca_cert_pem.clone()).unwrap();
        let server = cluster.node_tls("eu-west").unwrap().server(Some(&client_ca)).unwrap();
        let classify = |pem: &str| server.classify(Some(&leaf(pem)), now());
        assert_eq!(server.classify(None, now()), ClientCertificate::Absent);
        assert_eq!(server.classify(Some(&[]), now()), ClientCertificate::Absent);
        assert_eq!(classify(&cluster.regions["us-east"].0), ClientCertificate::OfCluster);
        let alice = cluster.issue_client("alice.example").unwrap();
        assert_eq!(classify(&alice.0), ClientCertificate::OfCluster);
        let bob = clients.issue_client("bob.example").unwrap();
        assert_eq!(classify(&bob.0), ClientCertificate::OfClientCa);
        let ClientCertificate::Untrusted(posing) = classify(&clients.regions["eu-west"].0) else {
            panic!("a client_ca certificate naming a region was trusted");
        };
        assert!(
            posing.to_string().contains("names a region (\"eu-west.cascade\")"),
            "{posing}"
        );
        let carol = stranger.issue_client("carol.example").unwrap();
        let ClientCertificate::Untrusted(why) = classify(&carol.0) else {
            panic!("a stranger's certificate was trusted");
        };
        let why = why.to_string();
        assert!(why.contains("SAN \"carol.example\""), "{why}");
        assert!(why.contains("is not issued by a CA this node trusts"), "{why}");
        assert!(why.contains("or of [auth] client_ca"), "{why}");
        // Without client_ca, its certificates are strangers too.
        let server = cluster.node_tls("eu-west").unwrap().server(None).unwrap();
        let ClientCertificate::Untrusted(why) = server.classify(Some(&leaf(&bob.0)), now()) else {
            panic!("a client_ca certificate was trusted without client_ca");
        };
        assert!(!why.to_string().contains("client_ca"), "{why}");
        // Verified at the time given: a year and a day on, even the
        // cluster's certificate has expired.
        let later = now() + Duration::from_secs(366 * 24 * 3600);
        let ClientCertificate::Untrusted(why) = server.classify(Some(&leaf(&alice.0)), later) else {
            panic!("an expired certificate was trusted");
        };
        assert!(why.to_string().contains("has expired"), "{why}");
    }

    #[test]
    fn a_client_ca_file_must_hold_a_certificate() {
        let err = ClientCa::from_pem("not a certificate".to_owned()).unwrap_err();
        assert!(err.to_string().contains("no PEM certificate found"), "{err}");
    }

    #[test]
    fn an_existing_ca_issues_certificates_for_new_regions() {
        let dir = tempfile::tempdir().unwrap();
        DevPki::generate(&["eu-west"]).unwrap().write(dir.path()).unwrap();
        let mut pki = DevPki::load_ca(dir.path()).unwrap();
        pki.add_region("ap-south").unwrap();
        assert_eq!(pki.node_tls("ap-south").unwrap().region().as_str(), "ap-south");
        assert!(pki.add_region("Not A Region").is_err());
    }
}
