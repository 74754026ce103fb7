//! The server side of a node's TLS: the handshake that only proves key
//! possession, and the classification of a client's chain after it (see
//! the crate doc, "Client certificates: checked after the handshake").

use super::*;

impl NodeTls {
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
