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

mod server;
pub use server::{ClientCa, ClientCertificate, ServerTls, Untrusted};

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
